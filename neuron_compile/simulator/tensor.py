"""Simulated memory: storages (one per allocation, tagged with a buffer) and ``NkiTensor`` views.

A view is ``(storage, offset, shape, strides)`` in elements (REFERENCE 1.3); ``.arr`` is the NumPy
view aliasing the storage, created once per view. Indexing follows the on-chip rules (dim 0 is the
partition dim and never disappears; on-chip results are never < 2-D) or NumPy rules for HBM. The
view methods (``slice``, ``permute``, ``broadcast``, ``reshape``, ``rearrange``, ``view``, ``ap`` ...)
never copy. On-chip allocations are charged to the per-partition SBUF/PSUM budgets of the current
simulation by liveness: each one lives from its allocation to its last use (the accesses of its
views stamp it with the instruction clock of :mod:`state`), as the NKI compiler's allocator sees
it, so a tile is free once its iteration or block no longer uses it, whether or not a Python name
still refers to it (:mod:`allocation` allocates and, when a kernel ends, sweeps those lifetimes).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from neuron_compile.errors import RemovedAPIError, SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import targets as _targets

log = logging.getLogger(__name__)


class MemoryRegion(enum.Enum):
    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.value}"


SBUF = MemoryRegion.sbuf
PSUM = MemoryRegion.psum
PRIVATE_HBM = MemoryRegion.private_hbm
SHARED_HBM = MemoryRegion.shared_hbm
ON_CHIP = frozenset((SBUF, PSUM))
HBM = frozenset((PRIVATE_HBM, SHARED_HBM))


def check_buffer(buffer: object, api: str) -> MemoryRegion:
    if isinstance(buffer, MemoryRegion):
        return buffer
    if isinstance(buffer, str):
        raise RemovedAPIError(f"{api}: buffer={buffer!r}: string buffers were removed in NKI 0.3.0; "
                              f"use buffer=nl.{buffer if buffer in MemoryRegion.__members__ else 'sbuf'}")
    raise SimulatorError(f"{api}: buffer={buffer!r} is not a memory region; use nl.sbuf, nl.psum, nl.hbm, "
                         "nl.private_hbm or nl.shared_hbm")


class Storage:
    """The flat backing array of one allocation (on-chip storages are ``(P, free...)`` row-major)."""

    __slots__ = ("data", "shape", "buffer", "dtype", "info", "name", "part_elems", "mm", "written", "_charge",
                 "life", "argument", "__weakref__")

    def __init__(self, data: np.ndarray, shape: tuple[int, ...], buffer: MemoryRegion, info: _dt.DTypeInfo,
                 name: str) -> None:
        self.data = data
        self.shape = shape
        self.buffer = buffer
        self.dtype = info.name
        self.info = info
        self.name = name
        self.part_elems = math.prod(shape[1:]) if len(shape) > 1 else 1
        # PSUM only: per element 0 = never written, 1 = written by nc_matmul, 2 = written by another instruction.
        self.mm: np.ndarray | None = np.zeros(data.shape, dtype=np.int8) if buffer is PSUM else None
        self.written = False
        self._charge: tuple[_state.Pool, int] | None = None
        # On-chip allocator-managed storages: [allocation tick, last-use tick] (see state.Lifetime).
        self.life: list[int] | None = None
        # A kernel argument: in nl.hbm, yet one tensor that every program of the launch sees (kernel_argument).
        self.argument = False

    def __del__(self) -> None:
        charge = self._charge
        if charge is not None:
            charge[0].live -= charge[1]


class DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def ds(start: int, size: int) -> DynSlice:
    return DynSlice(_scalar_int(start, "nl.ds"), int(size))


def _scalar_int(value: Any, api: str) -> int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, NkiTensor):
        if value.size != 1:
            raise SimulatorError(f"{api}: a runtime index must be a [1,1] tensor, got shape {value.shape}")
        return int(np.asarray(value.arr).reshape(-1)[0])
    if hasattr(value, "int_value"):  # VirtualRegister
        return int(value.int_value(api))
    raise SimulatorError(f"{api}: expected an int index, got {type(value).__name__} {value!r}")


def _opname(op: str) -> TypeError:
    return TypeError(f"NkiTensor does not overload '{op}': every operation is a call "
                     "(nisa.tensor_tensor / nisa.tensor_scalar / nl.add ...)")


class NkiTensor:
    """A view on a :class:`Storage`: element address = ``offset + sum(strides[k] * i_k)``."""

    __slots__ = ("storage", "offset", "shape", "strides", "dtype", "info", "_arr", "_indirect", "name", "_pinfo", "_mmv",
                 "oob")
    __array_ufunc__ = None  # numpy must not treat tensors as arrays (no operator overloading)

    def __init__(self, storage: Storage, offset: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 info: _dt.DTypeInfo | None = None, name: str | None = None) -> None:
        self.storage = storage
        self.offset = offset
        self.shape = shape
        self.strides = strides
        info = info or storage.info
        self.info = info
        self.dtype = info.name
        self._arr: np.ndarray | None = None
        self._indirect: tuple[NkiTensor, int, int] | None = None  # (index tile, row stride, rows)
        self.name = storage.name if name is None else name
        self._pinfo: tuple[int, int, int] | None = None
        self._mmv: np.ndarray | None = None
        # An ap() access outside its tensor: (why, first valid row, end of the valid rows along the pattern's first
        # pair, whether the offset is a runtime one). Nothing may use it, but a DMA with oob_mode.skip may use a runtime
        # one (it moves the valid rows).
        self.oob: tuple[str, int, int, bool] | None = None

    # ------------------------------------------------------------------ attributes
    @property
    def buffer(self) -> MemoryRegion:
        return self.storage.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.info.itemsize

    @property
    def arr(self) -> np.ndarray:
        """The NumPy view aliasing the storage (writes go to the storage); stamps the storage's last use."""
        if self.oob is not None:
            raise SimulatorError(self.oob[0])
        life = self.storage.life
        if life is not None:
            life[1] = _state.CLOCK[0]
        a = self._arr
        if a is None:
            isz = self.info.np_dtype.itemsize
            a = np.ndarray(self.shape, self.info.np_dtype, buffer=self.storage.data, offset=self.offset * isz,
                           strides=tuple(s * isz for s in self.strides))
            self._arr = a
        return a

    def mm_view(self) -> np.ndarray | None:
        """The PSUM written-by-matmul flags under this view (None off PSUM or for reinterpreted views)."""
        if self.oob is not None:
            raise SimulatorError(self.oob[0])
        m = self._mmv
        if m is None:
            st = self.storage
            if st.mm is None or self.info.np_dtype.itemsize != st.info.np_dtype.itemsize:
                return None
            m = np.ndarray(self.shape, np.int8, buffer=st.mm, offset=self.offset, strides=self.strides)
            self._mmv = m
        return m

    def part_elems(self) -> int:
        """Elements per partition of the storage, counted in this view's dtype (views may reinterpret)."""
        st = self.storage
        if self.info.itemsize == st.info.itemsize:
            return st.part_elems
        return st.part_elems * st.info.itemsize // self.info.itemsize

    def pinfo(self) -> tuple[int, int, int]:
        """(start partition, partition count, elements per partition) of an on-chip view."""
        p = self._pinfo
        if p is None:
            pe = self.part_elems()
            n = self.shape[0] if self.shape else 1
            p = (self.offset // pe, n, self.size // n if n else 0)
            self._pinfo = p
        return p

    def __repr__(self) -> str:
        return (f"NkiTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, buffer=nl."
                f"{self.buffer.value}, offset={self.offset}, strides={self.strides})")

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Any:
        raise TypeError("NkiTensor is not iterable; index it with t[i] or loop over range(t.shape[0])")

    def __bool__(self) -> bool:
        """A tensor object is true, whatever its values (which a traced kernel cannot branch on): AWS's nki-library
        tests ``if params.expert_index:`` on an optional tensor argument."""
        return True

    for _op, _sym in (("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"), ("floordiv", "//"),
                      ("mod", "%"), ("pow", "**"), ("matmul", "@"), ("and", "&"), ("or", "|"), ("xor", "^"),
                      ("lshift", "<<"), ("rshift", ">>")):
        def _raise(self: NkiTensor, other: object, _s: str = _sym) -> Any:
            raise _opname(_s)
        locals()[f"__{_op}__"] = _raise
        locals()[f"__r{_op}__"] = _raise
        locals()[f"__i{_op}__"] = _raise
    del _op, _sym, _raise

    def __neg__(self) -> Any:
        raise _opname("-")

    def __lt__(self, other: object) -> Any:
        raise _opname("<")

    __le__ = __gt__ = __ge__ = __lt__

    # ------------------------------------------------------------------ view helpers
    @property
    def on_chip(self) -> bool:
        return self.storage.buffer in ON_CHIP

    def _view(self, offset: int, shape: Sequence[int], strides: Sequence[int],
              info: _dt.DTypeInfo | None = None) -> NkiTensor:
        return NkiTensor(self.storage, offset, tuple(shape), tuple(strides), info or self.info, self.name)

    def _dim(self, dim: int, api: str, extra: int = 0) -> int:
        n = self.ndim + extra
        d = dim + n if dim < 0 else dim
        if not 0 <= d < n:
            raise SimulatorError(f"NkiTensor.{api}: dim {dim} out of range for a {self.ndim}-D tensor")
        return d

    def __getitem__(self, key: Any) -> NkiTensor:
        if not isinstance(key, tuple):
            key = (key,)
        nd = len(self.shape)
        if any(k is Ellipsis for k in key):
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (nd - len(key) + 1) + key[i + 1:]
        if len(key) > nd:
            raise SimulatorError(f"too many indices ({len(key)}) for tensor '{self.name}' of shape {self.shape}")
        onchip = self.storage.buffer in ON_CHIP
        offset = self.offset
        dims: list[list[int]] = []  # [size, stride, dropped]
        for d in range(nd):
            n = self.shape[d]
            s = self.strides[d]
            k = key[d] if d < len(key) else slice(None)
            if type(k) is slice and k.start is None and k.stop is None and k.step is None:
                dims.append([n, s, 0])
                continue
            if isinstance(k, DynSlice):
                if k.start < 0 or k.size < 0 or k.start + k.size > n:
                    raise SimulatorError(f"nl.ds({k.start}, {k.size}) out of bounds for dim {d} of size {n} "
                                         f"of tensor '{self.name}' {self.shape}")
                offset += k.start * s
                dims.append([k.size, s, 0])
            elif isinstance(k, slice):
                step = 1 if k.step is None else int(k.step)
                if step > 0:
                    start = 0 if k.start is None else int(k.start)
                    stop = n if k.stop is None else int(k.stop)
                    start += n if start < 0 else 0
                    stop += n if stop < 0 else 0
                    if start < 0 or stop > n:
                        raise SimulatorError(f"slice {start}:{stop} out of bounds for dim {d} of size {n} of "
                                             f"tensor '{self.name}' {self.shape}")
                    cnt = max(0, -(-(stop - start) // step))
                else:
                    start, stop, step = k.indices(n)
                    cnt = len(range(start, stop, step))
                if cnt:
                    offset += start * s
                dims.append([cnt, s * step, 0])
            else:
                i = _scalar_int(k, "NkiTensor.__getitem__")
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    raise SimulatorError(f"index {k} out of bounds for dim {d} of size {n} of tensor "
                                         f"'{self.name}' {self.shape}")
                offset += i * s
                dims.append([1, s, 0 if (onchip and d == 0) else 1])
        if onchip:
            kept = sum(1 for x in dims if not x[2])
            j = len(dims) - 1
            while kept < 2 and j > 0:  # on-chip results stay >= 2-D: keep the last int-indexed free dim
                if dims[j][2]:
                    dims[j][2] = 0
                    kept += 1
                j -= 1
        shape = tuple(x[0] for x in dims if not x[2])
        strides = tuple(x[1] for x in dims if not x[2])
        return NkiTensor(self.storage, offset, shape, strides, self.info, self.name)

    def __setitem__(self, key: Any, value: Any) -> None:
        from neuron_compile.simulator import isa_movement as mv

        view = self[key]
        if isinstance(value, NkiTensor):
            if view.on_chip and value.on_chip:
                mv.tensor_copy(dst=view, src=value)
            else:
                mv.dma_copy(dst=view, src=value)
        else:
            v = int(value) if view.info.is_int else float(value)
            mv.memset(dst=view, value=v)

    # ------------------------------------------------------------------ view methods
    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        d = self._dim(dim, "slice")
        key = [slice(None)] * self.ndim
        key[d] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: Any) -> NkiTensor:
        d = self._dim(dim, "select")
        if self.on_chip and d == 0:
            raise SimulatorError("NkiTensor.select: cannot select on the partition dim (dim 0) of an on-chip "
                                 "tensor; slice it with t[i:i+1] instead")
        key: list[Any] = [slice(None)] * self.ndim
        key[d] = _scalar_int(index, "NkiTensor.select")
        return self[tuple(key)]

    def permute(self, dims: Sequence[int]) -> NkiTensor:
        dims = [self._dim(int(x), "permute") for x in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise SimulatorError(f"NkiTensor.permute: {dims} is not a permutation of {self.ndim} dims")
        if self.on_chip and dims[0] != 0:
            raise SimulatorError("NkiTensor.permute: on-chip tensors keep the partition dim first (dims[0] == 0); "
                                 "use nisa.nc_transpose / dma_transpose to move data across partitions")
        return self._view(self.offset, [self.shape[i] for i in dims], [self.strides[i] for i in dims])

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        d = self._dim(dim, "broadcast")
        if self.on_chip and d == 0:
            raise SimulatorError("NkiTensor.broadcast: cannot broadcast the partition dim of an on-chip tensor "
                                 "(use nc_stream_shuffle, a ones matmul, or broadcast the HBM source)")
        if self.shape[d] != 1:
            raise SimulatorError(f"NkiTensor.broadcast: dim {d} has size {self.shape[d]}, only size-1 dims broadcast")
        shape = list(self.shape)
        strides = list(self.strides)
        shape[d] = int(size)
        strides[d] = 0
        return self._view(self.offset, shape, strides)

    def expand_dim(self, dim: int) -> NkiTensor:
        d = self._dim(dim, "expand_dim", extra=1)
        if self.on_chip and d == 0:
            raise SimulatorError("NkiTensor.expand_dim: cannot insert a dim before the partition dim on-chip")
        shape = list(self.shape)
        strides = list(self.strides)
        shape.insert(d, 1)
        strides.insert(d, strides[d] if d < len(strides) else 1)
        return self._view(self.offset, shape, strides)

    def squeeze_dim(self, dim: int) -> NkiTensor:
        d = self._dim(dim, "squeeze_dim")
        if self.shape[d] != 1:
            raise SimulatorError(f"NkiTensor.squeeze_dim: dim {d} has size {self.shape[d]}, not 1")
        if self.on_chip and (d == 0 or self.ndim <= 2):
            raise SimulatorError("NkiTensor.squeeze_dim: on-chip tensors keep the partition dim and stay >= 2-D")
        return self._view(self.offset, self.shape[:d] + self.shape[d + 1:], self.strides[:d] + self.strides[d + 1:])

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> NkiTensor:
        d = self._dim(dim, "reshape_dim")
        parts = [int(x) for x in shape]
        if parts.count(-1) > 1:
            raise SimulatorError("NkiTensor.reshape_dim: at most one -1")
        if -1 in parts:
            known = math.prod(x for x in parts if x != -1)
            parts[parts.index(-1)] = self.shape[d] // known if known else 0
        if math.prod(parts) != self.shape[d]:
            raise SimulatorError(f"NkiTensor.reshape_dim: {tuple(parts)} does not split dim {d} of size {self.shape[d]}")
        if self.on_chip and d == 0 and len(parts) != 1:
            raise SimulatorError("NkiTensor.reshape_dim: cannot split the partition dim of an on-chip tensor")
        st = self.strides[d]
        new_strides = []
        acc = st
        for n in reversed(parts):
            new_strides.append(acc)
            acc *= n
        new_strides.reverse()
        return self._view(self.offset, self.shape[:d] + tuple(parts) + self.shape[d + 1:],
                          self.strides[:d] + tuple(new_strides) + self.strides[d + 1:])

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        a = self._dim(start_dim, "flatten_dims")
        b = self._dim(end_dim, "flatten_dims")
        if a > b:
            raise SimulatorError(f"NkiTensor.flatten_dims: start_dim {a} > end_dim {b}")
        if self.on_chip and a == 0 and b > 0:
            raise SimulatorError("NkiTensor.flatten_dims: cannot merge the partition dim of an on-chip tensor")
        for k in range(a, b):
            if self.shape[k + 1] != 1 and self.shape[k] != 1 and self.strides[k] != self.strides[k + 1] * self.shape[k + 1]:
                raise SimulatorError(f"NkiTensor.flatten_dims: dims {a}..{b} of {self.shape} (strides {self.strides}) "
                                     "are not memory-contiguous")
        inner = [k for k in range(a, b + 1) if self.shape[k] != 1]
        stride = self.strides[inner[-1]] if inner else self.strides[b]
        return self._view(self.offset, self.shape[:a] + (math.prod(self.shape[a:b + 1]),) + self.shape[b + 1:],
                          self.strides[:a] + (stride,) + self.strides[b + 1:])

    def reshape(self, shape: Sequence[int]) -> NkiTensor:
        new = [int(x) for x in (shape if isinstance(shape, (tuple, list)) else (shape,))]
        if new.count(-1) == 1:
            known = math.prod(x for x in new if x != -1)
            new[new.index(-1)] = self.size // known if known else 0
        if math.prod(new) != self.size:
            raise SimulatorError(f"NkiTensor.reshape: cannot reshape {self.shape} ({self.size} elements) into "
                                 f"{tuple(new)}")
        if self.on_chip and (len(new) < 2 or new[0] != self.shape[0]):
            raise SimulatorError(f"NkiTensor.reshape: on-chip reshape must keep the partition dim "
                                 f"{self.shape[0]} first and stay >= 2-D, got {tuple(new)}")
        strides = _nocopy_strides(self.shape, self.strides, new)
        if strides is None:
            raise SimulatorError(f"NkiTensor.reshape: the layout of {self.shape} (strides {self.strides}) cannot be "
                                 f"viewed as {tuple(new)} without a copy; tensor_copy it first")
        return self._view(self.offset, new, strides)

    def rearrange(self, src_pattern: Any, dst_pattern: Any, fixed_sizes: dict[str, int] | None = None) -> NkiTensor:
        src = _parse_pattern(src_pattern)
        dst = _parse_pattern(dst_pattern)
        if len(src) != self.ndim:
            raise SimulatorError(f"NkiTensor.rearrange: pattern {src_pattern!r} has {len(src)} dims, tensor has "
                                 f"{self.ndim}")
        sizes = dict(fixed_sizes or {})
        t = self
        names: list[str] = []
        for d in range(len(src) - 1, -1, -1):
            group = src[d]
            if len(group) > 1:
                unknown = [g for g in group if g not in sizes]
                if len(unknown) > 1:
                    raise SimulatorError(f"NkiTensor.rearrange: give fixed_sizes for all but one of {group}")
                t = t.reshape_dim(d, [sizes.get(g, -1) for g in group])
        for group, n in zip([g for grp in src for g in grp], t.shape, strict=False):
            names.append(group)
            sizes[group] = n
        flat_dst = [g for grp in dst for g in grp]
        if sorted(flat_dst) != sorted(names):
            raise SimulatorError(f"NkiTensor.rearrange: {dst_pattern!r} must use exactly the axes of {src_pattern!r}")
        t = t.permute([names.index(g) for g in flat_dst])
        pos = 0
        spans = []
        for grp in dst:
            spans.append((pos, pos + len(grp) - 1))
            pos += len(grp)
        for a, b in reversed(spans):
            if b > a:
                t = t.flatten_dims(a, b)
        return t

    def view(self, dtype: Any) -> NkiTensor:
        new = _dt.info(dtype)
        old = self.info
        if new.name == old.name:
            return self
        if self.storage.info.np_dtype.itemsize != self.storage.info.itemsize:
            raise SimulatorError("NkiTensor.view: bit reinterpretation is unavailable with NKI_PRECISE_FP=0")
        a, b = old.itemsize, new.itemsize
        if self.ndim == 0 or (self.strides[-1] != 1 and self.shape[-1] != 1):
            raise SimulatorError("NkiTensor.view: the last dim must be contiguous to reinterpret the dtype")
        if any((s * a) % b for s in self.strides[:-1]) or (self.offset * a) % b or (self.shape[-1] * a) % b:
            raise SimulatorError(f"NkiTensor.view: {self.shape} {old.name} cannot be reinterpreted as {new.name}")
        shape = self.shape[:-1] + (self.shape[-1] * a // b,)
        strides = tuple(s * a // b for s in self.strides[:-1]) + (1,)
        return self._view(self.offset * a // b, shape, strides, new)

    reinterpret_cast = view

    def is_contiguous(self) -> bool:
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides), strict=False):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def get_pattern(self) -> list[list[int]]:
        return [[int(s), int(n)] for s, n in zip(self.strides, self.shape, strict=False)]

    def is_indirect(self) -> bool:
        return self._indirect is not None

    def indirect(self, index: Any, num_elem: int | None = None) -> NkiTensor:
        raise NotImplementedError("NkiTensor.indirect (NC-v4 compute-engine tensor indirection) is not "
                                  "implemented by the neuron_compile simulator")

    def vector_select(self, dim: int, vector_offset: NkiTensor) -> NkiTensor:
        if self.on_chip:
            raise SimulatorError("NkiTensor.vector_select: only HBM tensors can be row-gathered")
        if self._dim(dim, "vector_select") != 0:
            raise SimulatorError("NkiTensor.vector_select: only dim 0 is supported")
        t = self._view(self.offset, (vector_offset.shape[0],) + self.shape[1:], self.strides)
        t._indirect = (vector_offset, self.strides[0], self.shape[0])
        return t

    def ap(self, pattern: Sequence[Sequence[int]], offset: int | None = None, scalar_offset: Any = None,
           vector_offset: NkiTensor | None = None, indirect_dim: int = 0, dtype: Any = None) -> NkiTensor:
        """Raw access pattern ``[[stride, count], ...]`` (outer -> inner) against the storage.

        With ``dtype=`` of another size the storage's bytes are reinterpreted: strides, ``offset`` and
        the partition stride count elements of the new dtype."""
        st = self.storage
        pat = [(int(p[0]), int(p[1])) for p in pattern]
        if not pat:
            raise SimulatorError("NkiTensor.ap: empty pattern")
        off = int(offset or 0)
        info = self.storage.info if dtype is None else _dt.info(dtype)
        old, new = st.info.itemsize, info.itemsize
        if new != old:
            if st.info.np_dtype.itemsize != old or info.np_dtype.itemsize != new:
                raise SimulatorError("NkiTensor.ap: reinterpreting bytes (dtype= of another size) is unavailable with "
                                     "NKI_PRECISE_FP=0")
            # on chip a partition's bytes must hold whole new elements; in HBM (no partitions) only the whole tensor's
            if (st.buffer in ON_CHIP and (st.part_elems * old) % new) or (st.data.size * old) % new:
                raise SimulatorError(f"NkiTensor.ap: {st.info.name} storage '{st.name}' {st.shape} cannot be viewed "
                                     f"as {info.name} (its size in bytes is not a multiple of {new})")
        part_elems = st.part_elems * old // new
        n_elems = st.data.size * old // new
        if st.buffer in ON_CHIP:
            if pat[0][1] > 1 and pat[0][0] != part_elems:
                raise SimulatorConstraintError("NkiTensor.ap", "pattern", pat[0],
                                               f"partition stride == elements per partition ({part_elems})",
                                               f"tensor '{st.name}'")
            if len(pat) < 2:
                raise SimulatorError("NkiTensor.ap: on-chip patterns need a partition pair and >= 1 free pair")
        if scalar_offset is not None:  # the start moves by whole slices of the tensor ap is called on
            if not 0 <= indirect_dim < len(self.shape):
                raise SimulatorError(f"NkiTensor.ap: indirect_dim {indirect_dim} out of range for a "
                                     f"{len(self.shape)}-D tensor")
            off += _scalar_int(scalar_offset, "NkiTensor.ap") * math.prod(self.shape[indirect_dim + 1:]) * old // new
        t = NkiTensor(st, off, tuple(c for _, c in pat), tuple(s for s, _ in pat), info, st.name)
        first = 0
        if vector_offset is not None:
            if st.buffer in ON_CHIP:
                raise SimulatorError("NkiTensor.ap: vector_offset indexes an HBM tensor only")
            if indirect_dim != 0:
                raise SimulatorError("NkiTensor.ap: vector_offset supports indirect_dim=0 only")
            n_cols = vector_offset.shape[1] if vector_offset.ndim >= 2 else 1
            if n_cols > 1:  # [P, N] indices are read column by column (index i*P + p is at [p, i])
                if vector_offset.size < pat[0][1]:
                    raise SimulatorError(f"NkiTensor.ap: vector_offset {vector_offset.shape} holds "
                                         f"{vector_offset.size} indices but the indirect pattern pair counts "
                                         f"{pat[0][1]}")
            elif vector_offset.shape[0] != pat[0][1]:
                raise SimulatorError(f"NkiTensor.ap: vector_offset has {vector_offset.shape[0]} indices but the "
                                     f"indirect pattern pair counts {pat[0][1]}")
            # rows of the tensor ap is called on (a reshape of the storage indexes its own rows)
            t._indirect = (vector_offset, math.prod(self.shape[1:]) * old // new, self.shape[0])
            first = 1
        lo = off + sum(min(0, (c - 1) * s) for s, c in pat[first:] if c)
        hi = off + sum(max(0, (c - 1) * s) for s, c in pat[first:] if c)
        if any(c == 0 for _, c in pat):
            return t
        if lo < 0 or hi >= n_elems:
            why = (f"NkiTensor.ap: pattern {pat} with offset {off} addresses elements {lo}..{hi}, outside tensor "
                   f"'{st.name}' of {n_elems} elements")
            if vector_offset is not None:
                raise SimulatorError(why)
            if scalar_offset is None:  # a descriptor no instruction may use (kernels build some they never use)
                t.oob = (why, 0, 0, False)
            else:
                t.oob = (why + " (a DMA with oob_mode=nisa.oob_mode.skip skips the rows outside)",
                         *_rows_inside(pat, off, n_elems), True)
        return t


def _rows_inside(pat: list[tuple[int, int]], off: int, n_elems: int) -> tuple[int, int]:
    """The rows ``[r0, r1)`` along the first pattern pair whose every element lies in ``[0, n_elems)`` (the rows'
    addresses move monotonically with the row, so they are one range; empty as ``(0, 0)``)."""
    stride, rows = pat[0]
    lo = sum(min(0, (c - 1) * s) for s, c in pat[1:])
    hi = sum(max(0, (c - 1) * s) for s, c in pat[1:])
    inside = [r for r in range(rows) if off + r * stride + lo >= 0 and off + r * stride + hi < n_elems]
    return (inside[0], inside[-1] + 1) if inside else (0, 0)


def _parse_pattern(p: Any) -> list[list[str]]:
    if isinstance(p, (tuple, list)):
        return [[str(x) for x in g] if isinstance(g, (tuple, list)) else [str(g)] for g in p]
    groups: list[list[str]] = []
    cur: list[str] | None = None
    for tok in str(p).replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            cur = []
        elif tok == ")":
            groups.append(cur or [])
            cur = None
        elif cur is not None:
            cur.append(tok)
        else:
            groups.append([tok])
    return groups


def _nocopy_strides(old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]) -> list[int] | None:
    """Strides viewing ``old`` as ``new_shape`` without copying, or None (NumPy's no-copy reshape rule)."""
    if 0 in new_shape:
        return [1] * len(new_shape)
    olds = [(n, s) for n, s in zip(old_shape, old_strides, strict=False) if n != 1]
    od = [n for n, _ in olds]
    os_ = [s for _, s in olds]
    newnd, oldnd = len(new_shape), len(od)
    out = [0] * newnd
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < newnd and oi < oldnd:
        np_ = new_shape[ni]
        op = od[oi]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= od[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if os_[ok] != od[ok + 1] * os_[ok + 1]:
                return None
        out[nj - 1] = os_[oj - 1]
        for nk in range(nj - 1, ni, -1):
            out[nk - 1] = out[nk] * new_shape[nk]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = out[ni - 1] if ni >= 1 else 1
    for nk in range(ni, newnd):
        out[nk] = last
    return out


# ---------------------------------------------------------------------------------------- allocation

def _contig(shp: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for x in reversed(shp):
        strides.append(acc)
        acc *= x
    return tuple(reversed(strides))


def check_dtype_target(dtype: str, api: str, label: str) -> None:
    """float8_e4m3fn (OCP FP8, no inf) exists on NeuronCore-v4 (trn3) only: the Neuron compiler rejects it for
    trn1/trn2 (NCC_EVRF051), whose FP8 is the legacy float8_e4m3 (max 240) and float8_e5m2."""
    if dtype == _dt.float8_e4m3fn and _targets.limits().nc_version < 4:
        raise SimulatorConstraintError(api, label, dtype, "a dtype of the target: float8_e4m3fn is NeuronCore-v4 "
                                       "(trn3) only; trn1/trn2 have float8_e4m3 and float8_e5m2",
                                       f"target {_targets.limits().name}")


def from_array(arr: np.ndarray, buffer: MemoryRegion = PRIVATE_HBM, name: str = "") -> NkiTensor:
    """An HBM tensor holding a copy of ``arr`` (dtype mapped to its NKI dtype)."""
    dt = _dt.info(_dt.from_numpy_dtype(arr.dtype))
    check_dtype_target(dt.name, "kernel argument", name or "hbm_tensor")
    data = np.array(arr, dtype=dt.np_dtype, copy=True, order="C").reshape(-1)
    shp = tuple(int(x) for x in arr.shape)
    st = Storage(data, shp, buffer, dt, name or "hbm_tensor")
    return NkiTensor(st, 0, shp, _contig(shp), dt, st.name)


def kernel_argument(arr: np.ndarray, name: str, shared: bool = False) -> NkiTensor:
    """A kernel argument: in ``nl.hbm`` (an alias of ``private_hbm``; the docs' MX matmul example asserts
    ``arg.buffer == nl.hbm``) for a single program, in ``nl.shared_hbm`` when ``shared`` (an SPMD/LNC launch: every
    program sees the caller's tensor, as AWS's simulator gives it). Either way a ``core_barrier`` may synchronise
    on it."""
    t = from_array(arr, SHARED_HBM if shared else PRIVATE_HBM, name)
    t.storage.argument = True
    return t


def to_numpy(t: NkiTensor) -> np.ndarray:
    """A copy of the view's values with the NumPy dtype matching its NKI dtype (bool_ -> bool)."""
    a = np.array(t.arr, copy=True)
    if t.dtype == _dt.bool_:
        return a != 0
    real = _dt.low_precision_type(t.dtype)
    if real is not None and a.dtype != np.dtype(real):
        return a.astype(real)
    return a
