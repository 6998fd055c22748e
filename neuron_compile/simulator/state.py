"""Per-simulation mutable state: memory pools, accumulator registers, SPMD program ids.

A fresh :class:`SimState` is pushed by every ``simulate`` call, so capacity accounting and the
ScalarE/VectorE accumulator registers (REFERENCE 3.5) never leak between kernels. Code running
outside any simulation (unit tests calling ``nisa`` directly) uses a default process-wide state.
The stack is per thread: the two programs of a synchronising LNC2 launch run as threads
(simulator/lnc.py), each with its own state.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

# The instruction clock: advanced by every nisa instruction issued by kernel code and every on-chip
# allocation; a storage's views stamp it on access, so [allocation tick, last-use tick] is its lifetime. Programs
# running as threads share it: ticks stay monotonic, so each program's own lifetimes keep their order (all the
# capacity sweep reads); `CLOCK[0] += 1` makes no call, so CPython does not switch threads inside it.
CLOCK = [0]


@dataclass(frozen=True)
class Lifetime:
    """One allocator-managed on-chip tile: ``life`` is its storage's [allocation, last-use] ticks."""

    life: list[int]
    nbytes: int  # per partition
    sbuf: bool
    label: str
    shape: tuple[int, ...]
    dtype: str


class Pool:
    """Live bytes per partition of one on-chip memory (SBUF or PSUM) within one simulation."""

    __slots__ = ("live", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.live = 0

    def release(self, nbytes: int) -> None:
        self.live -= nbytes


class SimState:
    __slots__ = ("sbuf", "psum", "act_acc", "dve_acc", "program_id", "grid", "seed", "shared", "shared_replay",
                 "strict_capacity", "capacity_warned", "rng_state", "peers", "lifetimes")

    def __init__(self, program_id: tuple[int, ...] = (), grid: tuple[int, ...] = (), strict_capacity: bool = True) -> None:
        self.sbuf = Pool("sbuf")
        self.psum = Pool("psum")
        # 128 per-lane fp32 accumulators per engine (ScalarE: activation family; VectorE: exponential,
        # select_reduce, range_select, tensor_scalar_reduce, tensor_scalar_cumulative).
        self.act_acc = np.zeros(128, dtype=np.float32)
        self.dve_acc = np.zeros(128, dtype=np.float32)
        self.program_id = program_id
        self.grid = grid
        self.seed = 0
        # shared_hbm allocations of SPMD program 0, replayed (same storages) by programs 1..n-1.
        self.shared: list[object] = []
        self.shared_replay: list[object] | None = None
        # Over-budget on-chip allocations raise when strict (the backend's kernels, unit tests) and
        # warn once otherwise (kernels run through nki.simulate / @nki.jit, like AWS's simulator).
        self.strict_capacity = strict_capacity
        self.capacity_warned = False
        self.lifetimes: list[Lifetime] = []
        # Per-engine PRNG state (nisa.rng / dropout / rand2 / rand_set_state), seeded lazily.
        self.rng_state: dict[str, object] = {}
        # The lnc.Rendezvous shared by the two programs of a threaded LNC2 launch (None otherwise).
        self.peers: object = None


_DEFAULT = SimState()
_LOCAL = threading.local()


def _stack() -> list[SimState]:
    try:
        return _LOCAL.stack  # type: ignore[no-any-return]
    except AttributeError:
        _LOCAL.stack = [_DEFAULT]
        return _LOCAL.stack  # type: ignore[no-any-return]


def current() -> SimState:
    return _stack()[-1]


def push(s: SimState) -> None:
    _stack().append(s)


def pop(s: SimState) -> None:
    stack = _stack()
    if stack[-1] is s:
        stack.pop()
    else:  # defensive: unwinding out of order
        stack.remove(s)


def in_kernel() -> bool:
    return len(_stack()) > 1
