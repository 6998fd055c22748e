"""``nl`` basics: allocation (``ndarray/zeros/ones/full/...``), ``tile_size``, buffers and their
predicates, SPMD ids, loops (``fori_loop``, ``while_loop``, deprecated range aliases), ``NKIObject``,
``no_reorder``, ``device_print``, ``shared_constant``/``shared_identity_matrix`` and RNG seeding.

Compute wrappers (``nl.add``, ``nl.exp``, ``nl.sum``, ``nl.matmul`` ...) live in :mod:`nl_ops`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.allocation import allocate
from neuron_compile.simulator.tensor import (
    PRIVATE_HBM,
    PSUM,
    SBUF,
    SHARED_HBM,
    MemoryRegion,  # noqa: F401 - re-exported as nl.MemoryRegion
    NkiTensor,
    check_buffer,
    from_array,
)

log = logging.getLogger(__name__)

sbuf = SBUF
psum = PSUM
private_hbm = PRIVATE_HBM
hbm = PRIVATE_HBM  # alias (REFERENCE 1.2)
shared_hbm = SHARED_HBM


def is_hbm(buffer: Any) -> bool:
    return check_buffer(buffer, "nl.is_hbm") in (PRIVATE_HBM, SHARED_HBM)


def is_on_chip(buffer: Any) -> bool:
    return check_buffer(buffer, "nl.is_on_chip") in (SBUF, PSUM)


def is_psum(buffer: Any) -> bool:
    return check_buffer(buffer, "nl.is_psum") is PSUM


def is_sbuf(buffer: Any) -> bool:
    return check_buffer(buffer, "nl.is_sbuf") is SBUF


class _TileSize:
    """``nl.tile_size``: hardware tile limits; some depend on the simulated target."""

    pmax = 128
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    @property
    def psum_fmax(self) -> int:
        warnings.warn("nl.tile_size.psum_fmax is deprecated since NKI 0.4.0; use nl.tile_size.psum_bank_fmax",
                      DeprecationWarning, stacklevel=2)
        return 512

    @property
    def psum_num_banks(self) -> int:
        return _targets.limits().psum_banks

    @property
    def sbuf_size_bytes(self) -> int:
        return _targets.limits().sbuf_physical_bytes * 128

    @property
    def sbuf_fmax_bytes(self) -> int:
        return _targets.limits().sbuf_partition_bytes

    @property
    def sbuf_fmax(self) -> int:
        return _targets.limits().sbuf_partition_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        warnings.warn("nl.tile_size.total_available_sbuf_size is deprecated since NKI 0.4.0; use "
                      "nl.tile_size.sbuf_fmax_bytes", DeprecationWarning, stacklevel=2)
        return _targets.limits().sbuf_partition_bytes


tile_size = _TileSize()


def _record_memset(t: NkiTensor) -> None:
    if _trace.ACTIVE is not None:
        _trace.record("vector", "memset", (t,))


def ndarray(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", address: Any = None) -> NkiTensor:
    """Allocate an uninitialised tensor (filled with the NaN / 4 sentinel); ``address=(partition_offset,
    byte_offset)`` places an SBUF/PSUM tile by hand (not charged to the allocator's budget)."""
    if address is not None and check_buffer(buffer, "nl.ndarray") not in (SBUF, PSUM):
        raise SimulatorError("nl.ndarray: address=(partition_offset, byte_offset) places SBUF/PSUM tiles only, "
                             f"not nl.{check_buffer(buffer, 'nl.ndarray').value}")
    return allocate(shape, dtype, buffer, name, "nl.ndarray", address=address)


def zeros(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    t = allocate(shape, dtype, buffer, name, "nl.zeros", fill=0)
    _record_memset(t)
    return t


def ones(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    t = allocate(shape, dtype, buffer, name, "nl.ones", fill=1)
    _record_memset(t)
    return t


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    t = allocate(shape, dtype, buffer, name, "nl.full")
    from neuron_compile.simulator.isa_movement import memset

    memset(t, int(fill_value) if t.info.is_int else float(fill_value))
    return t


def zeros_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    return allocate(x.shape, dtype or x.dtype, buffer or x.buffer, name, "nl.empty_like")


def _rng() -> np.random.Generator:
    return np.random.default_rng(_state.current().seed)


def rand(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """U[0, 1) values (seeded by ``random_seed``)."""
    t = allocate(shape, dtype, buffer, name, "nl.rand")
    st = _state.current()
    g = np.random.default_rng(st.seed)
    st.seed += 1
    C.write(t, g.random(t.shape, dtype=np.float32))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "rng", (t,))
    return t


def random_seed(seed: Any) -> None:
    if not isinstance(seed, NkiTensor) or seed.size != 1:
        raise SimulatorError("nl.random_seed: seed must be a [1,1] int32 SBUF tensor (an int is rejected on hardware)")
    _state.current().seed = int(np.asarray(seed.arr).reshape(-1)[0])


def shared_constant(constant: Any) -> NkiTensor:
    """A ``shared_hbm`` tensor holding a NumPy array (or the contents of a ``.npy`` path)."""
    arr = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    return from_array(arr, SHARED_HBM, "shared_constant")


def shared_identity_matrix(n: int, dtype: Any = _dt.uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An n x n identity matrix in SBUF (the moving operand of PE transposes)."""
    t = dst if dst is not None else allocate((n, n), dtype, sbuf, f"identity_{n}", "nl.shared_identity_matrix")
    C.write(t, np.eye(n, dtype=np.float32))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "iota", (t,))
    return t


def program_id(axis: int = 0) -> int:
    pid = _state.current().program_id
    return int(pid[axis]) if axis < len(pid) else 0


def num_programs(axes: Any = 0) -> int:
    grid = _state.current().grid
    if isinstance(axes, (tuple, list)):
        out = 1
        for a in axes:
            out *= grid[a] if a < len(grid) else 1
        return out
    return int(grid[axes]) if axes < len(grid) else 1


def program_ndim() -> int:
    return len(_state.current().grid)


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """Keep source order (the simulator always runs in program order)."""
    yield


def device_print(print_prefix: str, tensor: Any) -> None:
    from neuron_compile.simulator.tensor import to_numpy

    print(print_prefix, to_numpy(tensor) if isinstance(tensor, NkiTensor) else tensor)


def _reg_value(v: Any, api: str) -> int:
    """An int loop bound: a compile-time int, a VirtualRegister with an integer payload, or a 1-element tensor."""
    if isinstance(v, NkiTensor):
        return int(np.asarray(v.arr).reshape(-1)[0])
    int_value = getattr(v, "int_value", None)
    if int_value is not None:  # VirtualRegister
        return int(int_value(api))
    return int(v)


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[int], Any], step: int = 1) -> None:
    """Runtime loop: the simulator runs it in Python, passing the induction value as an int."""
    api = "nl.fori_loop"
    if not isinstance(step, int) or step <= 0:
        raise SimulatorError(f"{api}: step must be a positive compile-time int, got {step!r}")
    for i in range(_reg_value(lower, api), _reg_value(upper, api), step):
        if body_fun(i) is not None:
            raise SimulatorError(f"{api}: body_fun must return None")


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Runtime loop: while the condition register is non-zero (checked before each iteration),
    ``r = body_fun(r)``. The body gets a copy of the register (passed by value) and returns the next
    condition register. A float32 payload counts as non-zero when ``!= 0.0``."""
    from neuron_compile.simulator.isa_control import VirtualRegister

    api = "nl.while_loop"
    r = init
    if not isinstance(r, VirtualRegister):
        raise SimulatorError(f"{api}: init must be a VirtualRegister (nisa.register_alloc / register_load), "
                             f"got {type(r).__name__} {r!r}")
    while r.nonzero():
        arg = VirtualRegister(r.value)
        arg._set(r.value, r.dtype)
        r = body_fun(arg)
        if not isinstance(r, VirtualRegister):
            raise SimulatorError(f"{api}: body_fun must return the next condition register (a VirtualRegister, "
                                 f"e.g. nisa.register_alloc(0) to stop), got {type(r).__name__}")


def _deprecated_range(name: str, replacement: str) -> Callable[..., range]:
    def fn(start: int, stop: int | None = None, step: int = 1) -> range:
        warnings.warn(f"nl.{name} is deprecated: {replacement}", DeprecationWarning, stacklevel=2)
        return range(start, stop, step) if stop is not None else range(start)
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


affine_range = _deprecated_range("affine_range", "use Python range() (it is an alias)")
sequential_range = _deprecated_range("sequential_range", "use Python range() (it is an alias)")
static_range = _deprecated_range("static_range", "use Python range() (it is an alias)")


def dynamic_range(start: Any, stop: Any = None, step: int = 1) -> range:
    """Deprecated runtime loop (NKI 0.6.0): bounds may be ints or integer ``VirtualRegister``\\ s."""
    warnings.warn("nl.dynamic_range is deprecated since NKI 0.6.0: use nl.fori_loop(lower, upper, body_fun) or "
                  "nl.while_loop(init, body_fun)", DeprecationWarning, stacklevel=2)
    api = "nl.dynamic_range"
    if not isinstance(step, int) or step <= 0:
        raise SimulatorError(f"{api}: step must be a positive compile-time int, got {step!r}")
    if stop is None:
        return range(0, _reg_value(start, api), step)
    return range(_reg_value(start, api), _reg_value(stop, api), step)


class _NKIObjectMeta(type):
    """Keeps :class:`NKIObject`'s keyword ``__init__`` on a ``@dataclass`` subclass without annotated fields, whose
    generated ``__init__`` would take no arguments (AWS's kernels construct such classes with keywords). With
    fields, the generated ``__init__`` runs, but a field without a default may be left out as with a plain
    NKIObject (NKI's ``__init__(**kwargs)``; nki-library's mlp_tkg never passes ``remainderIFused``)."""

    def __setattr__(cls, name: str, value: Any) -> None:
        fields = getattr(cls, "__dataclass_fields__", None)
        if name == "__init__" and fields == {}:
            return  # set by @dataclass, which fills __dataclass_fields__ first
        if name == "__init__" and fields:
            value = _tolerate_left_out_fields(value)
        super().__setattr__(name, value)


class _Unset:
    def __repr__(self) -> str:
        return "<unset NKIObject field>"


_UNSET = _Unset()


def _tolerate_left_out_fields(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a ``@dataclass`` ``__init__`` so required fields left out of the call stay unset (reading one before a
    method assigns it raises AttributeError), instead of raising TypeError."""
    params = list(inspect.signature(init).parameters.values())[1:]  # after self
    required = [p.name for p in params if p.default is inspect.Parameter.empty]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = {p.name for p in params[:len(args)]} | set(kwargs)
        missing = [n for n in required if n not in given]
        init(self, *args, **kwargs, **dict.fromkeys(missing, _UNSET))
        for n in missing:
            if self.__dict__.get(n) is _UNSET:
                object.__delattr__(self, n)

    return __init__


class NKIObject(metaclass=_NKIObjectMeta):
    """Base of user classes in kernels (the language guide's meta-programming subset): a dataclass-like
    ``__init__`` over the annotated fields of the class and its bases, unless the class defines its
    own ``__init__`` or ``@dataclass`` generates one from annotated fields (then that one runs: defaults,
    ``default_factory``, ``frozen``, ``__post_init__``). Without annotated fields, keyword arguments become
    attributes, with or without ``@dataclass``. An annotated field left out (and without a class default) stays
    unset, with or without ``@dataclass``: NKI 0.6's ``NKIObject.__init__(**kwargs)`` sets what it is given, and
    AWS's kernels fill such fields in a method after construction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        fields = _fields(cls)
        if not fields:
            if args:
                raise TypeError(f"{cls.__name__}() takes no positional arguments (it declares no annotated fields)")
            for k, v in kwargs.items():
                object.__setattr__(self, k, v)
            return
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} positional arguments but {len(args)} were given")
        values = dict(zip(fields, args, strict=False))
        for k, v in kwargs.items():
            if k not in fields:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {k!r}")
            if k in values:
                raise TypeError(f"{cls.__name__}() got multiple values for argument {k!r}")
            values[k] = v
        for f in fields:
            if f in values:
                object.__setattr__(self, f, values[f])
            elif hasattr(cls, f):
                object.__setattr__(self, f, getattr(cls, f))
            # else: unset until a method assigns it (nki-library's moe_cte derives fields after construction);
            # reading it first raises AttributeError
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()


def _fields(cls: type) -> list[str]:
    fields: list[str] = []
    for klass in reversed(cls.__mro__):
        for f in klass.__dict__.get("__annotations__", {}):
            if f not in fields:
                fields.append(f)
    return fields
