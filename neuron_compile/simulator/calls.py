"""The call layer of the ``nisa`` / ``nl`` namespaces: instruction handles and migration hints.

Every ``nisa`` instruction returns an :class:`NkiInstruction` handle (the NKI 0.6 return value,
useful only for ``.depends_on``). A call whose arguments do not bind to the documented signature
is explained instead of failing with a bare ``TypeError``: the legacy value-returning form
(``x = nisa.tensor_tensor(a, b, op)``: NKI 0.2 moved every output to an explicit ``dst=``) and the
removed ``mask=`` keyword of the ``nl`` wrappers (NKI 0.2) raise :class:`RemovedAPIError` naming
the current form, any other mismatch a :class:`TypeError` quoting the documented signature.
Using a handle as a tensor raises the same migration hint.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from neuron_compile import nki_api
from neuron_compile.errors import RemovedAPIError
from neuron_compile.simulator import state as _state

log = logging.getLogger(__name__)

_LEGACY_RESULT = ("ISA calls stopped returning their result in NKI 0.2: allocate the output with nl.ndarray(shape, "
                  "dtype, buffer=nl.sbuf) and pass it as dst= (x = nisa.op(...) becomes nisa.op(dst=x, ...))")


def signature(module: str, qual: str) -> str:
    """The documented signature ``module.qual(params)`` from the NKI 0.6 listing ('' when unknown)."""
    e = nki_api.entry(module, qual)
    if e is None or e["params"] is None:
        return ""
    parts = []
    for name, kind, default in e["params"]:
        prefix = "**" if kind == "var_keyword" else "*" if kind == "var_positional" else ""
        parts.append(f"{prefix}{name}" + (f"={default}" if default is not None else ""))
    return f"{module}.{qual}({', '.join(parts)})"


class NkiInstruction:
    """Handle of an issued instruction (``nisa.NkiInstruction``). ``depends_on(*producers)`` records
    a scheduling edge; the simulator runs in program order, so the edge changes nothing here."""

    __slots__ = ("instruction", "name", "producers")

    def __init__(self, handle: Any = None, name: str | None = None) -> None:
        self.instruction = str(handle)
        self.name = name
        self.producers: tuple[NkiInstruction, ...] = ()

    def depends_on(self, *producers: NkiInstruction) -> NkiInstruction:
        for p in producers:
            if not isinstance(p, NkiInstruction):
                raise TypeError(f"NkiInstruction.depends_on: producers must be instruction handles returned by "
                                f"nisa calls, got {type(p).__name__}")
        self.producers += producers
        return self

    def __getattr__(self, attr: str) -> Any:
        if attr in ("shape", "dtype", "buffer", "ndim", "size", "ap", "arr", "storage", "offset", "strides"):
            raise RemovedAPIError(f"an NkiInstruction handle (from nisa.{self.instruction}) is not a tensor: "
                                  f"{_LEGACY_RESULT}")
        raise AttributeError(f"'NkiInstruction' object has no attribute {attr!r}")

    def __getitem__(self, key: Any) -> Any:
        raise RemovedAPIError(f"an NkiInstruction handle (from nisa.{self.instruction}) is not a tensor: "
                              f"{_LEGACY_RESULT}")

    def __repr__(self) -> str:
        return f"NkiInstruction(nisa.{self.instruction}" + (f", name={self.name!r})" if self.name else ")")


def _bind_failed(exc: TypeError) -> bool:
    """True when the TypeError comes from binding the call's arguments, not from inside the function."""
    tb = exc.__traceback__
    return tb is not None and tb.tb_next is None


def isa(fn: Callable[..., Any], qual: str) -> Callable[..., Any]:
    """``fn`` as a ``nisa`` instruction: returns an :class:`NkiInstruction`, explains legacy calls."""
    sig = signature("nki.isa", qual)
    dst_first = qual in nki_api.dst_first_isa_ops()

    clock = _state.CLOCK

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        clock[0] += 1  # one instruction: its operands' accesses share this tick
        try:
            out = fn(*args, **kwargs)
        except TypeError as exc:
            if not _bind_failed(exc):
                raise
            if "mask" in kwargs:
                raise RemovedAPIError(f"nisa.{qual}: parameter mask= is gone (removed in NKI 0.2.0); use "
                                      "min()-bounded slices") from None
            if dst_first and "dst" not in kwargs:
                raise RemovedAPIError(f"nisa.{qual}(...): {exc}. {_LEGACY_RESULT}. Signature: {sig}") from None
            raise TypeError(f"nisa.{qual}: {exc}; the NKI 0.6 signature is {sig}") from None
        return NkiInstruction(qual, kwargs.get("name")) if out is None else out

    return call


def language(fn: Callable[..., Any], qual: str) -> Callable[..., Any]:
    """``fn`` as an ``nl`` function: explains ``mask=`` and other calls that do not bind."""
    sig = signature("nki.language", qual)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TypeError as exc:
            if not _bind_failed(exc):
                raise
            if "mask" in kwargs:
                raise RemovedAPIError(f"nl.{qual}: parameter mask= is gone (removed in NKI 0.2.0); use min()-bounded "
                                      "slices of the operands instead") from None
            raise TypeError(f"nl.{qual}: {exc}; the NKI 0.6 signature is {sig or 'not documented'}") from None

    return call
