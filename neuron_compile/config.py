"""Typed configuration for neuron-compile.

Each knob has a type, a default, an optional ``NEURON_COMPILE_*`` environment variable and a flag
saying whether it changes generated code (those knobs feed the cache key automatically, see
:func:`codegen_snapshot`). Read values as attributes (``config.target``); override them for a
block with :func:`patch`, which works as a context manager and as a decorator.

Environment variables are read when a knob is first looked up and re-read after ``reload_env()``;
a bad value raises :class:`ConfigError` naming the variable, the value and the expected type.

Why not torch's own config machinery (``torch.utils._config_module``): it is private API that changes between
torch releases, and it has no per-knob choices, numeric ranges or the error messages above; what it offers
beyond this module (patching, env overrides) is the 20 lines of :func:`patch` and ``reload_env``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from neuron_compile.errors import ConfigError

TARGETS = ("trn1", "trn2", "trn3")
EXECUTORS = ("auto", "simulator", "nki-simulate", "nki-jit")


@dataclass(frozen=True)
class Knob:
    name: str
    type: type
    default: Any
    doc: str
    env: str | None = None
    codegen: bool = False
    choices: tuple[Any, ...] | None = None
    bounds: tuple[float, float] | None = None  # inclusive range of a numeric knob
    unit: str = ""


_KNOBS: dict[str, Knob] = {}


def _knob(name: str, type_: type, default: Any, doc: str, *, env: bool = True, codegen: bool = False,
          choices: tuple[Any, ...] | None = None, bounds: tuple[float, float] | None = None, unit: str = "") -> None:
    _KNOBS[name] = Knob(name, type_, default, doc, f"NEURON_COMPILE_{name.upper()}" if env else None,
                        codegen, choices, bounds, unit)


# Code generation (feed the cache key).
_knob("target", str, "trn2", "Trainium generation kernels are generated and simulated for.",
      codegen=True, choices=TARGETS)
_knob("lnc", int, 0, "Physical NeuronCores per logical core that a kernel is launched on (the NKI SPMD grid "
      "kernel[n](...), work split by nl.program_id): 0 = the target's default (LNC=2 on trn2 and trn3, 1 on trn1), "
      "1 = one core, 2 = both cores of a trn2/trn3 logical core.", codegen=True, choices=(0, 1, 2), bounds=(0, 2))
_knob("free_tile", int, 2048, "Free-dim elements per tile in elementwise/row kernels.", codegen=True,
      bounds=(1, 1 << 20))
_knob("row_resident_bytes", int, 96 * 1024,
      "SBUF bytes per partition a row kernel may keep resident before it is split.", codegen=True,
      bounds=(1, 1 << 24), unit="bytes")
_knob("fuse", bool, True, "Fuse elementwise prologues/epilogues into neighbouring kernels.", codegen=True)
_knob("fuse_matmul_norm", bool, True, "Let a reduction over a matmul's whole output row (N <= 2048, e.g. a "
      "LayerNorm after a residual add) join the matmul kernel's epilogue.", codegen=True)
_knob("pipeline_row_ops", bool, True, "A matmul kernel with row ops in its epilogue (a LayerNorm after a residual "
      "add) computes tile i's row statistics before tile i - 1's normalisation, so neither chain waits on itself.",
      codegen=True)
_knob("attention_unshifted", bool, True, "Attention without an additive mask first runs its softmax without the "
      "row max (exp(s) directly: no max pass, no transpose of P), checks every row's sum and output on chip, and "
      "reruns the exact kernel when a row falls outside the safe range.", codegen=True)
_knob("attention_check_first", bool, True, "The unshifted attention kernel checks each program's first head group "
      "on its own: when a row of it fails, the rest of the unchecked pass is skipped and the exact kernel runs at once "
      "(the cost of a failed check drops from a whole pass to one group's).", codegen=True)
_knob("attention_check_first_flops", int, 1 << 34, "FLOPs a program's unshifted attention pass needs before its first "
      "head group gets its own check (which costs one drain of every engine and a flag exchange, ~8 us on trn2).",
      codegen=True, bounds=(0, 1 << 40), unit="FLOPs")
_knob("attention_dma_transpose", bool, True, "The unshifted attention kernel loads Q^T and K^T through the DMA "
      "engines' transpose (2-byte dtypes, trn2/trn3) instead of transposing the loaded rows on TensorE.", codegen=True)
# Running.
_knob("executor", str, "auto", "Who runs kernels: auto, simulator, nki-simulate or nki-jit.", choices=EXECUTORS)
_knob("float64", str, "warn", "float64 inputs: 'warn' runs them as float32 with a warning, 'error' refuses.",
      choices=("warn", "error"))
# Distributed jobs (neuron_compile.rank_agreement).
_knob("rank_agreement_timeout", float, 1800.0, "Seconds a rank waits for the other ranks to finish compiling the "
      "same distributed graph (if one fails, all raise its error instead of hanging on a collective).",
      bounds=(0.1, 86400.0), unit="seconds")
# Cache.
_knob("cache", bool, True, "Use the persistent artifact cache.")
_knob("cache_dir", str, "", "Cache root (default $XDG_CACHE_HOME/neuron-compile or ~/.cache/neuron-compile).")
_knob("cache_lock_timeout", float, 600.0, "Seconds to wait for another process compiling the same graph.",
      bounds=(0.0, 86400.0), unit="seconds")
_knob("warm_frames", bool, True, "Warm starts skip Dynamo's capture too (torch's caching precompile, stored in "
      "our cache; identity guards torch can't serialize are kept as fingerprints, see neuron_compile.warm_guards). "
      "Read when neuron_compile is imported (NEURON_COMPILE_WARM_FRAMES=0 turns it off).")
_knob("cache_allow_shared", bool, False, "Accept a cache directory writable by other users (team caches).")
_knob("remote_cache", str, "", "A shared cache tier behind the local one: redis://host:port/db (empty: none).")
_knob("remote_cache_timeout", float, 2.0, "Seconds a remote cache operation may take before the remote is "
      "skipped for the rest of the process.", bounds=(0.01, 600.0), unit="seconds")
_knob("remote_cache_secret", str, "", "Team secret: remote entries are signed with HMAC-SHA256 under it and "
      "used at once; without it a remote entry is verified by recompiling it the first time this host uses it.")
# Precompile (set by `neuron-compile precompile` for the script it captures; see neuron_compile.precompile).
_knob("capture_dir", str, "", "Capture mode: record every ATen graph under this folder instead of compiling it, and "
      "run no kernel (outputs are zeros of the right shapes).")
_knob("capture_steps", int, 2, "Capture mode: stop the script after this many calls of its first compiled graph.",
      bounds=(1, 1_000_000))
# Debugging.
_knob("debug_dir", str, "", "Write per-graph debug dumps (graphs, IR, kernels) under this folder.")
# Migration evaluation (see neuron_compile.fallback / neuron_compile.check).
_knob("fallback", str, "strict", "Unsupported ATen ops: 'strict' refuses the graph, 'eager' runs them in PyTorch "
      "between kernels (recorded, see neuron_compile.get_fallback_ops()).", choices=("strict", "eager"))
_knob("check", bool, False, "Also run every compiled graph eagerly and compare outputs (numeric check mode).")
_knob("progress", str, "auto", "Compile progress bar on stderr: 'auto' (a terminal, not CI, many kernels), "
      "'always' or 'never'.", choices=("auto", "always", "never"))
_knob("test_break_op", str, "", "TEST ONLY: the ATen op (e.g. aten.exp.default) whose pointwise lowering is "
      "deliberately broken (its result shifted by +1.0), so tests can prove the check mode catches a bad "
      "lowering. Never set this outside tests.", codegen=True)


def _parse(knob: Knob, raw: str, source: str) -> Any:
    try:
        if knob.type is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                value: Any = True
            elif low in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(raw)
        else:
            value = knob.type(raw.strip() if knob.type in (int, float) else raw)
    except ValueError:
        expected = "a boolean (1/0, true/false, yes/no, on/off)" if knob.type is bool else \
            f"{'an integer' if knob.type is int else 'a number' if knob.type is float else knob.type.__name__}"
        raise ConfigError(f"{source}={raw}: expected {expected}{_range_text(knob)}") from None
    _check_choice(knob, value, source, shown=raw)
    return value


def _range_text(knob: Knob) -> str:
    if knob.bounds is None:
        return ""
    lo, hi = (int(b) if knob.type is int or float(b).is_integer() else b for b in knob.bounds)
    return f" in [{lo}, {hi}]" + (f" ({knob.unit})" if knob.unit else "")


def _check_choice(knob: Knob, value: Any, source: str, shown: object = None) -> None:
    shown = value if shown is None else shown
    if knob.choices is not None and value not in knob.choices:
        raise ConfigError(f"{source}={shown}: expected one of {', '.join(map(str, knob.choices))}")
    if knob.bounds is not None and knob.type in (int, float):
        lo, hi = knob.bounds
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            kind = "an integer" if knob.type is int else "a finite number"
            raise ConfigError(f"{source}={shown}: expected {kind}{_range_text(knob)}")


class _Config:
    """Attribute access to the knobs; overrides from ``patch`` win over env vars over defaults."""

    def __init__(self) -> None:
        object.__setattr__(self, "_overrides", threading.local())
        object.__setattr__(self, "_env_cache", {})

    def _stack(self) -> list[dict[str, Any]]:
        local = self._overrides
        if not hasattr(local, "stack"):
            local.stack = []
        return local.stack

    def __getattr__(self, name: str) -> Any:
        knob = _KNOBS.get(name)
        if knob is None:
            raise AttributeError(f"neuron_compile.config has no knob {name!r}; known: {', '.join(sorted(_KNOBS))}")
        for layer in reversed(self._stack()):
            if name in layer:
                return layer[name]
        if knob.env:
            raw = os.environ.get(knob.env)
            if raw is not None and raw != "":
                cache = self._env_cache
                if cache.get(name, (None,))[0] != raw:
                    cache[name] = (raw, _parse(knob, raw, knob.env))
                return cache[name][1]
        return knob.default

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("use neuron_compile.config.patch(...) or NEURON_COMPILE_* env vars to change config")

    @contextlib.contextmanager
    def _patch_cm(self, values: dict[str, Any]) -> Iterator[None]:
        checked = {}
        for name, value in values.items():
            knob = _KNOBS.get(name)
            if knob is None:
                raise ConfigError(f"unknown config knob {name!r}; known: {', '.join(sorted(_KNOBS))}")
            if knob.type is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, knob.type) or (knob.type is int and isinstance(value, bool)):
                raise ConfigError(f"config.{name}={value!r}: expected {knob.type.__name__}")
            _check_choice(knob, value, f"config.{name}")
            checked[name] = value
        stack = self._stack()
        stack.append(checked)
        try:
            yield
        finally:
            stack.remove(checked)

    def patch(self, **values: Any) -> _Patch:
        """Override knobs inside a ``with`` block or for a decorated function."""
        return _Patch(self, values)

    def knobs(self) -> dict[str, Knob]:
        return dict(_KNOBS)

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _KNOBS}


class _Patch(contextlib.ContextDecorator):
    def __init__(self, cfg: _Config, values: dict[str, Any]) -> None:
        self._cfg = cfg
        self._values = values
        self._cms: list[contextlib.AbstractContextManager[None]] = []

    def __enter__(self) -> None:
        cm = self._cfg._patch_cm(self._values)
        cm.__enter__()
        self._cms.append(cm)

    def __exit__(self, *exc: object) -> None:
        self._cms.pop().__exit__(*exc)


config = _Config()


def codegen_snapshot() -> dict[str, Any]:
    """The values of every knob that changes generated code (part of the cache key)."""
    return {name: getattr(config, name) for name, knob in sorted(_KNOBS.items()) if knob.codegen}


def patch(**values: Any) -> _Patch:
    return config.patch(**values)


def wraps_patch(values: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form used by the backend to apply per-compile ``options``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with config.patch(**values):
                return fn(*args, **kwargs)

        return inner

    return deco
