"""Sequencer registers for runtime control flow: ``VirtualRegister``, ``register_alloc``,
``register_move``, ``register_load``, ``register_store`` (REFERENCE 1.5 "Runtime loops", 3.6).

A register holds one 32-bit value: an integer (payloads int8..int32 / uint8..uint32, and
immediates) or a float32 (loaded from a float32 tensor). ``nl.while_loop`` runs its body while the
condition register is non-zero (a float32 payload is non-zero when ``!= 0.0``: 0.5 counts as
true); ``nl.fori_loop`` bounds and ``.ap(scalar_offset=...)`` need integer payloads.

The instructions run on the engine sequencers, not on a datapath; each one is traced with engine
``"sequencer"``. ``register_load``/``register_store`` move one element between a register and a
one-element tensor in SBUF or HBM (the real API documents both; PSUM is refused).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import lnc as _lnc
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.language import NKIObject
from neuron_compile.simulator.tensor import PSUM, NkiTensor

log = logging.getLogger(__name__)

# Register payload dtypes (REFERENCE 1.5: "32-bit, u8...i32/fp32 payloads").
PAYLOAD_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32", "float32")
_INT_MIN, _INT_MAX = -(2 ** 31), 2 ** 32 - 1  # an immediate must fit 32 bits (signed or unsigned)


class VirtualRegister(NKIObject):
    """A 32-bit sequencer register. ``value`` is an int, or a float for a float32 payload
    (``dtype`` says which); ``frozen`` registers are read-only (instructions refuse to write them)."""

    __slots__ = ("value", "dtype", "frozen")

    def __init__(self, state: Any = None, frozen: bool = False) -> None:
        value = 0 if state is None else state
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "dtype", "float32" if isinstance(value, float) else "int32")
        object.__setattr__(self, "frozen", bool(frozen))

    def _set(self, value: int | float, dtype: str) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "dtype", dtype)

    @property
    def is_float(self) -> bool:
        return self.dtype == "float32"

    def nonzero(self) -> bool:
        """The runtime-loop condition: the value is not zero (float payloads compare as floats)."""
        return self.value != 0

    def int_value(self, api: str) -> int:
        """The value as an integer (loop bounds, scalar offsets); float32 payloads are refused."""
        if self.is_float:
            raise SimulatorError(f"{api}: the register holds a float32 payload ({self.value!r}); loop bounds and "
                                 "offsets need an integer register (load it from an integer tensor)")
        return int(self.value)

    def __bool__(self) -> bool:
        warnings.warn("bare `while reg:` on a VirtualRegister is deprecated in NKI 0.6.0: use "
                      "nl.while_loop(init, body_fun)", DeprecationWarning, stacklevel=2)
        return self.nonzero()

    def __repr__(self) -> str:
        return f"VirtualRegister(value={self.value!r}, dtype={self.dtype}{', frozen' if self.frozen else ''})"


def _dst_register(api: str, dst: Any) -> VirtualRegister:
    if not isinstance(dst, VirtualRegister):
        raise SimulatorError(f"{api}: dst must be a VirtualRegister from nisa.register_alloc(), "
                             f"got {type(dst).__name__}")
    if dst.frozen:
        raise SimulatorError(f"{api}: dst is a read-only register (a loop induction variable)")
    return dst


def _immediate(api: str, x: Any) -> int:
    if isinstance(x, (int, np.integer)):
        v = int(x)
        if not _INT_MIN <= v <= _INT_MAX:
            raise SimulatorError(f"{api}: immediate {v} does not fit a 32-bit register "
                                 f"(range [{_INT_MIN}, {_INT_MAX}])")
        return v
    raise SimulatorError(f"{api}: expected a compile-time int (or None), got {type(x).__name__} {x!r}")


def _scalar_tensor(api: str, name: str, t: Any) -> NkiTensor:
    """A one-element SBUF/HBM tensor with a register payload dtype."""
    if not isinstance(t, NkiTensor):
        raise SimulatorError(f"{api}: {name} must be an NkiTensor with exactly one element, got {type(t).__name__}")
    where = f"tensor '{t.name}' in nl.{t.buffer.value}"
    if t.size != 1:
        raise SimulatorConstraintError(api, name, t.shape, "exactly one element (shape [1] or [1, 1])", where)
    if t.buffer is PSUM:
        raise SimulatorConstraintError(api, name, "nl.psum", "a register moves data to/from SBUF or HBM",
                                       f"tensor '{t.name}' of shape {t.shape}; copy PSUM to SBUF first")
    if t.dtype not in PAYLOAD_DTYPES:
        raise SimulatorConstraintError(api, name, t.dtype, f"a 32-bit register payload: one of "
                                       f"{', '.join(PAYLOAD_DTYPES)}", where)
    return t


def register_alloc(x: int | None = None) -> VirtualRegister:
    """A new register holding ``x`` (None -> 0)."""
    api = "nisa.register_alloc"
    reg = VirtualRegister(0 if x is None else _immediate(api, x))
    if _trace.ACTIVE is not None:
        _trace.record("sequencer", "register_alloc", ())
    return reg


def register_move(dst: VirtualRegister, src: Any) -> None:
    """dst = src (an int immediate or another register)."""
    api = "nisa.register_move"
    _dst_register(api, dst)
    if isinstance(src, VirtualRegister):
        dst._set(src.value, src.dtype)
    else:
        dst._set(_immediate(api, src), "int32")
    if _trace.ACTIVE is not None:
        _trace.record("sequencer", "register_move", ())


def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    """dst = the single element of ``src`` (SBUF or HBM; integer or float32 payload)."""
    api = "nisa.register_load"
    _dst_register(api, dst)
    _scalar_tensor(api, "src", src)
    v = np.asarray(src.arr).reshape(-1)[0]
    if src.info.is_float:
        dst._set(float(np.float32(v)), "float32")
    else:
        dst._set(int(v), src.dtype)
    if _trace.ACTIVE is not None:
        _trace.record("sequencer", "register_load", (src,))


def register_store(dst: NkiTensor, src: VirtualRegister) -> None:
    """The single element of ``dst`` = the register's value cast to dst's dtype (ints saturate,
    floats round half to even)."""
    api = "nisa.register_store"
    _scalar_tensor(api, "dst", dst)
    if not isinstance(src, VirtualRegister):
        raise SimulatorError(f"{api}: src must be a VirtualRegister from nisa.register_alloc(), "
                             f"got {type(src).__name__}")
    value = np.asarray([src.value], dtype=np.float32 if src.is_float else np.int64)
    if dst.info.is_float:
        value = value.astype(np.float32)
    C.write(dst, value)
    if _trace.ACTIVE is not None:
        _trace.record("sequencer", "register_store", (dst,))


# ------------------------------------------------------------------------------ LNC synchronisation

_SEQUENTIAL_LNC = ("the launch ran its programs one after the other because the kernel's code does not name "
                   "nisa.core_barrier / nisa.sendrecv where the simulator looks (the kernel function, its nested "
                   "functions and the functions it calls by name, in any module outside the standard library, NumPy "
                   "and torch); call them from there so both programs run as threads")


def _lnc_checks(api: str) -> None:
    from neuron_compile.simulator import language as _lang

    C.need_version(api, 3)
    if _lang.num_programs() != 2:
        raise SimulatorConstraintError(api, "launch", f"{_lang.num_programs()} program(s)",
                                       "an LNC2 launch (kernel[2](...)): the instruction works between the two "
                                       "NeuronCores of a logical core")


def core_barrier(data: NkiTensor, cores: Any, engine: Any = None, name: str | None = None, **removed: Any) -> None:
    """Barrier between the two cores of an LNC2 launch (``cores=(0, 1)``) on a ``shared_hbm`` tensor or an argument."""
    from neuron_compile.simulator.enums import engine as _engine
    from neuron_compile.simulator.tensor import SHARED_HBM

    api = "nisa.core_barrier"
    if removed:
        C.removed_kwargs(api, removed)
    C.tensor(api, "data", data)
    eng = C.resolve_engine(api, _engine.gpsimd if engine is None else engine, ("gpsimd", "vector", "scalar", "sync",
                                                                                "tensor"), "gpsimd")
    if tuple(int(c) for c in cores) != (0, 1):
        raise SimulatorConstraintError(api, "cores", tuple(cores), "(0, 1), the only supported core set")
    if data.buffer is not SHARED_HBM and not data.storage.argument:
        raise SimulatorConstraintError(api, "data", f"nl.{data.buffer.value}",
                                       "a tensor in nl.shared_hbm or a kernel argument (both cores see those)")
    _lnc_checks(api)
    peer = _lnc.current_peer()
    if peer is None:
        raise SimulatorError(f"{api}: {_SEQUENTIAL_LNC}")
    rv, pid, other = peer
    rv.meet(pid, "core_barrier", None, other)
    if _trace.ACTIVE is not None:
        _trace.record(eng, "core_barrier", (data,))


def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
             dma_engine: Any = None, name: str | None = None, **removed: Any) -> None:
    """Send ``src`` to the other core of an LNC2 launch while receiving its tile into ``dst`` (SBUF both)."""
    from neuron_compile.simulator.enums import check_enum
    from neuron_compile.simulator.enums import dma_engine as _dma_engine

    api = "nisa.sendrecv"
    if removed:
        C.removed_kwargs(api, removed)
    mode = check_enum(_dma_engine.dma if dma_engine is None else dma_engine, _dma_engine, api, "dma_engine")
    pf = C.onchip(api, "dst", dst)
    C.same_pf(api, "src", C.onchip(api, "src", src), "dst", pf)
    C.sbuf_only(api, "src", src)
    C.sbuf_only(api, "dst", dst)
    if src.dtype != dst.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == src dtype ({src.dtype})")
    for nm, rank in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if int(rank) not in (0, 1):
            raise SimulatorConstraintError(api, nm, rank, "0 or 1 (the two cores of an LNC2 launch)")
    if mode is _dma_engine.gpsimd_dma:
        limit = {4: 1024, 2: 512, 1: 256}.get(src.itemsize, 1024)
        if pf[1] * src.itemsize > limit:
            raise SimulatorConstraintError(api, "src", f"{pf[1] * src.itemsize} B/partition",
                                           f"<= {limit} B per partition with dma_engine=gpsimd_dma")
    _lnc_checks(api)
    peer = _lnc.current_peer()
    if peer is None:
        raise SimulatorError(f"{api}: {_SEQUENTIAL_LNC}")
    rv, pid, other = peer
    if int(send_to_rank) != other or int(recv_from_rank) != other:
        raise SimulatorConstraintError(api, "send_to_rank/recv_from_rank", (int(send_to_rank), int(recv_from_rank)),
                                       f"the peer core ({other}) for both on program {pid} of an LNC2 launch")
    got = rv.meet(pid, "sendrecv", (np.array(C.raw(src), copy=True), src.shape, src.dtype), other)
    values, shape, dtype = got
    if shape != src.shape or dtype != src.dtype:
        raise SimulatorConstraintError(api, "src", f"{src.shape} {src.dtype} on program {pid}",
                                       f"the same shape and dtype as the peer's src ({shape} {dtype})")
    C.write_raw(dst, values)
    if _trace.ACTIVE is not None:
        _trace.record("dma", "sendrecv", (dst, src))
