"""Kernel launchers: family.py is the kernel layer every family goes through (desc -> config -> template constants
-> jit.build -> launch by name); one module per family (fp8_gemm, bf16_gemm) turns validated arrays into the
entry's named arguments. Importing this package imports neither numba nor the JIT."""
