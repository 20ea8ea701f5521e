"""``python -m deep_gemm.estimate M N K --dtype fp8``: the modelled chip time of one GEMM."""

import sys

from .gemm import main

sys.exit(main())
