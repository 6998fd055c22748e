"""Hardware limits the code generator respects (REFERENCE.md 1.4, 3.2): one place, no scattered literals."""

from __future__ import annotations

PMAX = 128  # partitions per SBUF/PSUM tile; max matmul contraction per instruction
PSUM_BANK_FMAX = 512  # fp32 elements per partition in one PSUM bank
GEMM_STATIONARY_FMAX = 128  # matmul stationary free size (output partitions)
GEMM_MOVING_FMAX = 512  # matmul moving free size on NC-v2/v3
BN_STATS_FMAX = 512
