"""Simulated Trainium generation and its per-target hardware limits.

``current_target()`` reads ``NEURON_PLATFORM_TARGET_OVERRIDE`` (unset -> "trn3", like the real
simulator); ``use_target(name)`` overrides it for a thread. Every limit that depends on the target
(SBUF bytes per partition, matmul free sizes, generation-only instructions) lives in :data:`LIMITS`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from neuron_compile.errors import SimulatorError

log = logging.getLogger(__name__)

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT_TARGET = "trn3"
_ALIASES = {"trn1": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2", "trn3": "trn3",
            "gen4": "trn3"}
VALID_NAMES = tuple(_ALIASES)


@dataclass(frozen=True)
class TargetLimits:
    name: str
    nc_version: int  # 2 = NC-v2 (trn1/inf2), 3 = NC-v3 (trn2), 4 = NC-v4 (trn3)
    sbuf_partition_bytes: int  # usable SBUF bytes per partition (REFERENCE 1.4)
    sbuf_physical_bytes: int
    psum_partition_bytes: int = 16 * 1024
    psum_bank_bytes: int = 2048
    psum_banks: int = 8
    pmax: int = 128
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax_fp32: int = 512  # matmul N limit for an fp32 PSUM dst
    gemm_moving_fmax_bf16: int = 512  # matmul N limit for a bf16 PSUM dst


LIMITS = {
    "trn1": TargetLimits("trn1", 2, 192 * 1024, 192 * 1024),
    "trn2": TargetLimits("trn2", 3, 208 * 1024, 224 * 1024),
    "trn3": TargetLimits("trn3", 4, 240 * 1024, 256 * 1024, gemm_moving_fmax_fp32=4096,
                         gemm_moving_fmax_bf16=8192),
}

_local = threading.local()
_env_cache: list[object] = [None, None]


def resolve(name: str, source: str = "target") -> str:
    key = str(name).strip().lower()
    got = _ALIASES.get(key)
    if got is None:
        raise SimulatorError(f"{source}={name!r} is not a valid target; expected one of {', '.join(VALID_NAMES)}")
    return got


def current_target() -> str:
    """The simulated target: ``use_target`` override, else the env var, else "trn3"."""
    override = getattr(_local, "target", None)
    if override is not None:
        return override
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return DEFAULT_TARGET
    if _env_cache[0] != raw:
        _env_cache[1] = resolve(raw, ENV_VAR)
        _env_cache[0] = raw
    return _env_cache[1]  # type: ignore[return-value]


def limits() -> TargetLimits:
    return LIMITS[current_target()]


def nc_version() -> int:
    return LIMITS[current_target()].nc_version


@contextlib.contextmanager
def use_target(name: str) -> Iterator[str]:
    """Simulate ``name`` (trn1/trn2/trn3 or an alias) inside the block, for this thread only."""
    resolved = resolve(name)
    previous = getattr(_local, "target", None)
    _local.target = resolved
    try:
        yield resolved
    finally:
        _local.target = previous
