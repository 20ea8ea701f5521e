"""GEMM kernel launchers, one module per kernel family (fp8_gemm, bf16_gemm): desc -> config -> template
constants -> jit.build -> launch. Importing this package imports neither numba nor the JIT."""
