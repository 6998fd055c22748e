"""Allocation of simulated memory: ``nl.ndarray`` and friends create a storage and its full view, charge on-chip
tiles to the per-partition SBUF/PSUM budgets of the current simulation (or place them at a hand-given address),
and :func:`check_capacity` sweeps the tiles' lifetimes when a kernel ends (:mod:`tensor` says how a tile lives
from its allocation to its last use).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator.tensor import (
    ON_CHIP,
    PSUM,
    SBUF,
    SHARED_HBM,
    MemoryRegion,
    NkiTensor,
    Storage,
    _contig,
    check_buffer,
    check_dtype_target,
)

log = logging.getLogger(__name__)


def allocate(shape: Sequence[int], dtype: Any, buffer: Any, name: str = "", api: str = "nl.ndarray",
             fill: float | None = None, address: Any = None) -> NkiTensor:
    """A fresh storage + full view, filled with the uninitialised-memory sentinel (or ``fill``).

    On-chip allocations are charged to the per-partition budget of the current simulation, except
    those placed by hand with ``address=(partition_offset, byte_offset)``: they are checked to lie
    inside the memory (and, in PSUM, to start on a bank) and occupy the place they name, which other
    such tiles may share (that is how kernels reuse a bank). Going over the budget raises in strict
    mode (our own kernels) and warns otherwise, like AWS's simulator, which leaves capacity to the
    compiler's spilling.
    """
    buf = check_buffer(buffer, api)
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shp = tuple(int(x) for x in shape)
    except TypeError:
        raise SimulatorError(f"{api}: shape {shape!r} must be a tuple of ints") from None
    if any(x < 0 for x in shp):
        raise SimulatorError(f"{api}: negative size in shape {shp}")
    info = _dt.info(dtype)
    label = name or f"{buf.value}_tensor"
    check_dtype_target(info.name, api, label)
    nbytes_pp = 0
    pool = None
    if buf in ON_CHIP:
        lim = _targets.limits()
        if not shp:
            raise SimulatorConstraintError(api, "shape", shp, "at least one dim (the partition dim)",
                                           f"allocation '{label}' in nl.{buf.value}")
        if shp[0] > lim.pmax:
            raise SimulatorConstraintError(api, "shape", shp, f"partition dim <= {lim.pmax}",
                                           f"allocation '{label}' in nl.{buf.value}")
        if len(shp) > 5:
            raise SimulatorConstraintError(api, "shape", shp, "at most 5 dims (partition + 4 free)",
                                           f"allocation '{label}'")
        # A 1-D on-chip tensor (the API's own examples use nl.ndarray([1], ...) for registers) is
        # its partition dim alone: one element per partition.
        nbytes_pp = math.prod(shp[1:]) * info.itemsize
        budget = lim.sbuf_partition_bytes if buf is SBUF else lim.psum_partition_bytes
        if address is not None:
            _check_address(api, label, buf, shp, nbytes_pp, budget, address)
        else:
            st_ = _state.current()
            pool = st_.sbuf if buf is SBUF else st_.psum
            if nbytes_pp > budget:
                raise SimulatorConstraintError(api, "shape", shp, f"{buf.value.upper()} bytes per partition <= {budget} "
                                               f"on {lim.name}", f"allocation '{label}' alone needs {nbytes_pp} B/partition")
    if buf is SHARED_HBM and _state.in_kernel() and _state.current().peers is not None:
        # threaded LNC2 launch: the i-th shared_hbm allocation of either program is one storage
        cur = _state.current()
        n = math.prod(shp)

        def make() -> Storage:
            return Storage(np.full(n, _dt.sentinel(info) if fill is None else fill, dtype=info.np_dtype), shp, buf,
                           info, label)

        shared = cur.peers.shared_storage(  # type: ignore[attr-defined]
            len(cur.shared), make, lambda prev: prev.shape == shp and prev.dtype == info.name)
        cur.shared.append(shared)
        return NkiTensor(shared, 0, shp, _contig(shp), info, label)
    if buf is SHARED_HBM and _state.in_kernel():
        cur = _state.current()
        replay = cur.shared_replay
        if replay is not None and len(cur.shared) < len(replay):
            prev = replay[len(cur.shared)]
            if prev.shape == shp and prev.dtype == info.name:  # type: ignore[attr-defined]
                cur.shared.append(prev)
                return NkiTensor(prev, 0, shp, _contig(shp), info, label)  # type: ignore[arg-type]
    n = math.prod(shp)
    value = _dt.sentinel(info) if fill is None else fill
    data = np.full(n, value, dtype=info.np_dtype)
    st = Storage(data, shp, buf, info, label)
    if pool is not None:
        pool.live += nbytes_pp
        st._charge = (pool, nbytes_pp)
        _state.CLOCK[0] += 1
        st.life = [_state.CLOCK[0], _state.CLOCK[0]]
        _state.current().lifetimes.append(_state.Lifetime(st.life, nbytes_pp, buf is SBUF, label, shp, info.name))
    elif buf is SHARED_HBM and _state.in_kernel():
        _state.current().shared.append(st)
    return NkiTensor(st, 0, shp, _contig(shp), info, label)


def _check_address(api: str, label: str, buf: MemoryRegion, shp: tuple[int, ...], nbytes_pp: int, budget: int,
                   address: Any) -> None:
    """``address=(partition_offset, byte_offset)``: inside the memory, PSUM tiles on a bank boundary."""
    try:
        part, byte = (int(a) for a in address)
    except (TypeError, ValueError):
        raise SimulatorError(f"{api}: address={address!r} must be (partition_offset, byte_offset) ints "
                             f"(allocation '{label}')") from None
    where = f"allocation '{label}' {shp} in nl.{buf.value}"
    if part < 0 or part + shp[0] > 128:
        raise SimulatorConstraintError(api, "address", (part, byte), f"partition_offset + {shp[0]} partitions <= 128",
                                       where)
    if byte < 0 or byte + nbytes_pp > budget:
        raise SimulatorConstraintError(api, "address", (part, byte),
                                       f"byte_offset + {nbytes_pp} B/partition <= {budget} B", where)
    if buf is PSUM and byte % 2048:
        raise SimulatorConstraintError(api, "address", (part, byte), "PSUM allocations start at a 2 KiB bank "
                                       "boundary (byte_offset a multiple of 2048)", where)


def check_capacity(kernel: str) -> None:
    """Peak live SBUF/PSUM bytes per partition of the current simulation (tiles live from allocation to
    last use) against the target's budgets: raise in strict mode (the backend's kernels), else warn once,
    like AWS's simulator, which leaves capacity to the compiler (it would spill or fail)."""
    st = _state.current()
    lim = _targets.limits()
    for sbuf, budget in ((True, lim.sbuf_partition_bytes), (False, lim.psum_partition_bytes)):
        lives = [lt for lt in st.lifetimes if lt.sbuf is sbuf]
        if not lives:
            continue
        events = sorted([(lt.life[0], 0, lt.nbytes) for lt in lives] + [(lt.life[1], 1, -lt.nbytes) for lt in lives])
        cur = peak = 0
        at = 0
        for tick, _kind, delta in events:
            cur += delta
            if cur > peak:
                peak, at = cur, tick
        if peak <= budget:
            continue
        name = "SBUF" if sbuf else "PSUM"
        live = sorted((lt for lt in lives if lt.life[0] <= at <= lt.life[1]), key=lambda lt: -lt.nbytes)
        shown = ", ".join(f"'{lt.label}' {lt.shape} {lt.dtype} ({lt.nbytes} B)" for lt in live[:6])
        more = f" and {len(live) - 6} more" if len(live) > 6 else ""
        detail = (f"kernel {kernel}: {peak} B/partition live at once ({len(live)} tiles: {shown}{more}); a tile lives "
                  "from its allocation to its last use: allocate tiles in the loop that uses them, or use fewer")
        if st.strict_capacity:
            raise SimulatorConstraintError(f"kernel {kernel}", name, peak, f"live {name} bytes per partition <= "
                                           f"{budget} on {lim.name}", detail)
        if not st.capacity_warned:
            st.capacity_warned = True
            from neuron_compile.simulator.checks import warn

            warn(f"{name}: live bytes per partition exceed {budget} on {lim.name} ({detail}); the compiler would "
                 "spill or fail here. Strict mode (the backend's own kernels) raises instead.")
