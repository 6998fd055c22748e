"""Instruction trace: one :class:`InstructionRecord` per executed ISA instruction.

Off by default; ``with trace() as t:`` turns it on for the block. Instructions check the module
global :data:`ACTIVE` once (``if trace.ACTIVE is not None``), so tracing costs nothing when off.
The records feed cost models (REFERENCE 4.4): engine, partitions, free size, dtypes, bytes, buffers,
plus each operand's shape and strides (contiguity, matmul K/M/N) and instruction flags
(``is_transpose``, ``double_row``). ``Trace.kernels`` marks where each simulated kernel's records
start, so a trace over a whole graph splits per kernel (:meth:`Trace.by_kernel`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstructionRecord:
    """One executed instruction. ``instruction`` is the bare ISA name ("nc_matmul"); ``dtypes``,
    ``buffers`` list the tensor operands in signature order (dst first); ``bytes`` is the sum of
    the operands' sizes; ``partitions``/``free_size`` describe the dst (the src for stores);
    ``shapes``/``strides`` (in elements) are per operand like ``dtypes``; ``flags`` name modes that
    change an instruction's cost (``is_transpose``, ``double_row``)."""

    engine: str
    instruction: str
    partitions: int
    free_size: int
    dtypes: tuple[str, ...]
    bytes: int
    buffers: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...] = ()
    strides: tuple[tuple[int, ...], ...] = ()
    flags: tuple[str, ...] = ()


@dataclass
class Trace:
    records: list[InstructionRecord] = field(default_factory=list)
    kernels: list[tuple[str, int]] = field(default_factory=list)  # (kernel name, index of its first record)

    def mark_kernel(self, name: str) -> None:
        self.kernels.append((name, len(self.records)))

    def by_kernel(self) -> list[tuple[str, list[InstructionRecord]]]:
        """Records split at the kernel marks (records before the first mark are dropped)."""
        ends = [start for _, start in self.kernels[1:]] + [len(self.records)]
        return [(name, self.records[start:end]) for (name, start), end in zip(self.kernels, ends, strict=True)]

    def count(self, instruction: str | None = None, engine: str | None = None) -> int:
        return sum(1 for r in self.records if (instruction is None or r.instruction == instruction)
                   and (engine is None or r.engine == engine))

    def instructions(self) -> list[str]:
        return [r.instruction for r in self.records]


ACTIVE: Trace | None = None
# A thread's own record list while the programs of an LNC2 launch run as threads (simulator/lnc.py): each program
# records into its own, and the launch appends them in program order, as the sequential path records them.
_LOCAL = threading.local()


def set_thread_trace(t: Trace | None) -> None:
    """Record this thread's instructions into ``t`` instead of :data:`ACTIVE` (None: back to ACTIVE)."""
    _LOCAL.trace = t


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every instruction executed inside the block (nested traces both record)."""
    global ACTIVE
    previous = ACTIVE
    t = Trace()
    ACTIVE = t
    try:
        yield t
    finally:
        if previous is not None:
            base = len(previous.records)
            previous.kernels.extend((name, base + start) for name, start in t.kernels)
            previous.records.extend(t.records)
        ACTIVE = previous


def record(engine: str, instruction: str, operands: Sequence[Any], main: Any = None,
           flags: tuple[str, ...] = ()) -> None:
    """Append a record built from the tensor operands (non-tensors are skipped)."""
    t = getattr(_LOCAL, "trace", None) or ACTIVE
    if t is None:
        return
    tensors = [o for o in operands if hasattr(o, "storage")]
    ref = main if main is not None else (tensors[0] if tensors else None)
    if ref is not None and ref.shape:
        parts = int(ref.shape[0])
        free = int(ref.size // parts) if parts else 0
    else:
        parts, free = 1, 1
    t.records.append(InstructionRecord(
        engine=engine, instruction=instruction, partitions=parts, free_size=free,
        dtypes=tuple(o.dtype for o in tensors), bytes=sum(o.size * o.itemsize for o in tensors),
        buffers=tuple(o.buffer.value for o in tensors), shapes=tuple(tuple(o.shape) for o in tensors),
        strides=tuple(tuple(o.strides) for o in tensors), flags=flags))


def mark_kernel(name: str) -> None:
    """Note that a kernel starts (called by the runner only while a trace is active)."""
    if ACTIVE is not None:
        ACTIVE.mark_kernel(name)
