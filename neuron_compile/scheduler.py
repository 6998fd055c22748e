"""The scheduling cost model: an event-driven list scheduler over one kernel's ordered instruction stream.

Input: instructions in program order, each an :class:`~neuron_compile.simulator.trace.InstructionRecord` plus the
tensors it reads and writes (views carrying their allocation, offset and strides) and its kernel source line; the
analytic stream of :mod:`neuron_compile.instruction_stream` produces them. Output: a :class:`Schedule`: the
kernel's makespan, each engine's busy time, and optionally the timeline (every instruction's start and end on its
engine or DMA queue) for a trace viewer.

The model (every constant is in :mod:`neuron_compile.costmodel` with the AWS document it comes from, or marked
assumed):

- one in-order queue per compute engine (TensorE, VectorE, ScalarE, GpSimdE) and per DMA issue queue (the two
  hardware-DGE queues of NC-v3/v4, a DMA taking the first free one; one on NC-v2); an instruction starts when its
  queue is free and its inputs are
  ready; its duration is the per-instruction cost of :mod:`neuron_compile.costmodel`;
- dependencies on the exact buffer regions each instruction touches: read-after-write, write-after-read and
  write-after-write on SBUF tiles (partition range x free byte range), PSUM banks and HBM ranges (rows x columns
  when the access is two-level, else the byte range), with the same-engine write-back wait (the dependent
  instruction interval) or the cross-engine semaphore latency;
- a DMA occupies its issue queue for the descriptor generation, starts moving data a fixed latency after its
  trigger, and splits its bytes over the DMA engines that serve its partitions (8 partitions each) at the
  engine bandwidth derated for short contiguous runs, and over this core's share of the chip's HBM bandwidth;
- PSUM is 8 banks of 2 KiB per partition: every PSUM tile takes whole banks, a free bank when one is free (the
  least recently released), else it waits for the oldest; SBUF tiles allocated at one kernel line rotate among
  ``ALLOC_BUFFERS`` physical buffers (double buffering) while SBUF has room, and when it is full the buffers of
  earlier lines whose tiles are all dead return to the allocator;
- a ``register_load`` (runtime branch input) drains every engine first.

Loops: :mod:`neuron_compile.instruction_stream` schedules the first iterations of a loop; once two consecutive
iterations issue the same instructions and advance every queue by the same period, the following identical
iterations are not scheduled one by one: the whole state moves forward by that period per iteration (their
instructions are still counted exactly). :meth:`Scheduler.frontier` / :meth:`Scheduler.shift` serve that.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from neuron_compile import costmodel as cm
from neuron_compile.simulator.trace import InstructionRecord

log = logging.getLogger(__name__)

COMPUTE = ("tensor", "vector", "scalar", "gpsimd")
DMA_QUEUES = ("dma_q0", "dma_q1")
PSUM_BANK_BYTES = 2048
PSUM_BANKS = 8
PARTITIONS = 128  # of SBUF and PSUM


def _dead(slot: list[Any]) -> bool:
    """Whether an SBUF buffer's last allocation is no longer referenced (its tile is dead)."""
    return slot[1] is None or slot[1]() is None


class Alloc:
    """One allocation (``nl.ndarray`` or a kernel argument): the physical buffer its views resolve to."""

    __slots__ = ("buffer", "pstride", "itemsize", "site", "bytes_pp", "key", "banks", "__weakref__")

    def __init__(self, buffer: str, pstride: int, itemsize: int, site: Any, bytes_pp: int) -> None:
        self.buffer = buffer
        self.pstride = pstride  # elements per partition of the storage (on-chip); 0 for HBM
        self.itemsize = itemsize
        self.site = site  # (kernel line, bytes per partition): allocations of one line rotate among buffers
        self.bytes_pp = bytes_pp
        self.key: Any = None  # physical buffer, assigned at first scheduled use
        self.banks: tuple[int, ...] = ()


@dataclass
class Schedule:
    """The scheduled kernel (one program of a launch grid)."""

    target: str
    makespan_ns: float = 0.0
    busy_ns: dict[str, float] = field(default_factory=dict)
    scheduled: int = 0  # instructions scheduled one by one
    skipped: int = 0  # loop iterations moved forward by their period instead
    timeline: list[tuple[str, float, float, str, int]] | None = None  # (queue, start, end, instruction, line)
    sync_ns: list[float] = field(default_factory=list)  # end of each core_barrier / sendrecv, in program order


class _Lane:
    """Busy intervals of one shared resource (a DMA engine, the HBM pipe): a transfer takes the earliest gap after
    it is ready (transfers of different queues interleave on the engines), not the end of the program-order list."""

    __slots__ = ("s", "e")

    def __init__(self) -> None:
        self.s: list[float] = []
        self.e: list[float] = []

    def place(self, ready: float, dur: float) -> tuple[float, float]:
        """Take ``dur`` of busy time in the earliest gaps from ``ready`` on (a transfer's bytes go through whenever the
        resource is free: work-conserving, so splitting a transfer never finishes it earlier). Returns (start, end)."""
        s, e = self.s, self.e
        t = ready
        left = dur
        i = bisect.bisect_right(e, t)
        if i < len(s) and s[i] <= t:
            t = e[i]
            i += 1
        start = None
        while left > 1e-12:
            gap = (s[i] if i < len(s) else math.inf) - t
            if gap <= 1e-12:
                t = e[i]
                i += 1
                continue
            take = min(gap, left)
            if start is None:
                start = t
            # the busy interval [t, t + take), merged with its neighbours
            if i > 0 and e[i - 1] >= t - 1e-9:
                e[i - 1] = t + take
            else:
                s.insert(i, t)
                e.insert(i, t + take)
                i += 1
            left -= take
            t += take
            if i < len(s) and s[i] <= t + 1e-9:  # closed the gap: merge with the next interval
                e[i - 1] = e[i]
                del s[i], e[i]
                if left > 1e-12:
                    t = e[i - 1]
        return (ready if start is None else start), t

    @property
    def last(self) -> float:
        return self.e[-1] if self.e else 0.0

    def prune(self, floor: float) -> None:
        n = bisect.bisect_right(self.e, floor)
        if n:
            del self.s[:n]
            del self.e[:n]

    def shift(self, after: float, delta: float) -> None:
        """Skipped loop iterations: busy time after ``after`` moves ``delta`` later, and the window they leave
        counts as busy (their transfers ran there; later transfers must not backfill it)."""
        ivs = [(a, b) if b <= after else ((a, b + delta) if a <= after else (a + delta, b + delta))
               for a, b in zip(self.s, self.e, strict=True)]
        ivs.append((after, after + delta))
        ivs.sort()
        self.s, self.e = [], []
        for a, b in ivs:
            if self.e and a <= self.e[-1] + 1e-9:
                self.e[-1] = max(self.e[-1], b)
            else:
                self.s.append(a)
                self.e.append(b)


class _Access:
    __slots__ = ("p0", "p1", "lo", "hi", "rows", "end", "engine")

    def __init__(self, p0: int, p1: int, lo: int, hi: int, rows: Any, end: float, engine: str) -> None:
        self.p0, self.p1, self.lo, self.hi, self.rows, self.end, self.engine = p0, p1, lo, hi, rows, end, engine

    def overlaps(self, p0: int, p1: int, lo: int, hi: int, rows: Any) -> bool:
        if not (p0 < self.p1 and self.p0 < p1 and lo < self.hi and self.lo < hi):
            return False
        a, b = self.rows, rows
        if a is None or b is None or a[0] != b[0]:
            return True
        # two two-level accesses with the same row stride: rows x columns boxes
        return a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]

    def covers(self, p0: int, p1: int, lo: int, hi: int) -> bool:
        return self.p0 <= p0 and p1 <= self.p1 and self.lo <= lo and hi <= self.hi and self.rows is None


class _Region:
    __slots__ = ("reads", "writes")

    def __init__(self) -> None:
        self.reads: list[_Access] = []
        self.writes: list[_Access] = []


class OverBudget(Exception):
    """Scheduling stopped: the program's makespan passed its ``budget_ns`` (a tuner's candidate that can no longer
    beat the ones it has; the makespan only grows as instructions are scheduled)."""


class Scheduler:
    """List scheduler state for one program of one kernel (``cores``: physical cores sharing the HBM ceiling)."""

    def __init__(self, target: str, timeline: bool = False) -> None:
        from neuron_compile.simulator.targets import LIMITS

        hw = cm.hardware(target)
        self.hw = hw
        self.target = target
        v = hw.nc_version
        ghz = {"tensor": hw.pe_ghz, "vector": hw.vector_ghz, "scalar": hw.scalar_ghz, "gpsimd": hw.gpsimd_ghz}
        self.ghz = ghz
        # same-engine read-after-write: the write-back before the dependent read (TensorE accumulates in-line)
        self.writeback = {e: (cm.DEP_II_CYCLES[v] - cm.INSTRUCTION_OVERHEAD) / ghz[e] for e in COMPUTE}
        self.writeback["tensor"] = 0.0
        self.dge_ns = cm.DGE_ISSUE_NS[v]
        self.dma_queues = DMA_QUEUES[:cm.DMA_ISSUE_QUEUES[v]]
        self.hbm_ns_per_byte = 1.0 / hw.hbm_core_gbps_estimate  # GB/s = bytes/ns
        self.sbuf_budget = LIMITS[target].sbuf_partition_bytes
        self.free: dict[str, float] = dict.fromkeys(COMPUTE + DMA_QUEUES, 0.0)
        self.dma_engines = [_Lane() for _ in range(hw.dma_engines)]
        self.hbm = _Lane()
        self.busy: dict[str, float] = dict.fromkeys(COMPUTE + ("dma", "hbm"), 0.0)
        self.end = 0.0
        self.budget_ns = math.inf  # OverBudget once the makespan passes this (kernel_time_ns's budget)
        self.sync: list[float] = []  # ends of the cross-core synchronising instructions (Schedule.sync_ns)
        self.regions: dict[Any, _Region] = {}
        # allocation state
        self.psum_banks: list[Any] = [None] * PSUM_BANKS  # live Alloc (weak) per bank
        self.psum_released = [0] * PSUM_BANKS  # assignment order (the least recently used free bank first)
        # site -> slots [key, live alloc ref or None, allocation order, bytes per partition]
        self.sites: dict[Any, list[list[Any]]] = {}
        self.site_first: dict[Any, int] = {}  # site -> allocation order of its first allocation
        self.sbuf_bytes = 0
        self._order = 0
        self._serial = 0
        self._dmas = 0
        self.scheduled = 0
        self.skipped = 0
        self.timeline: list[tuple[str, float, float, str, int]] | None = [] if timeline else None

    # -------------------------------------------------------------------------------------------- physical
    def _key(self, alloc: Alloc) -> Any:
        """The physical buffer of an allocation (assigned at its first scheduled use)."""
        if alloc.key is not None:
            return alloc.key
        import weakref

        if alloc.buffer == "psum":
            need = max(1, min(PSUM_BANKS, math.ceil(alloc.bytes_pp / PSUM_BANK_BYTES)))
            best = None
            for b0 in range(0, PSUM_BANKS - need + 1):
                group = range(b0, b0 + need)
                live = any(self.psum_banks[b] is not None and self.psum_banks[b]() is not None for b in group)
                score = (live, max(self.psum_released[b] for b in group))
                if best is None or score < best[0]:
                    best = (score, b0)
            assert best is not None
            b0 = best[1]
            ref = weakref.ref(alloc)
            for b in range(b0, b0 + need):
                self.psum_banks[b] = ref
                self._order += 1
                self.psum_released[b] = self._order  # not released yet: newest
            alloc.banks = tuple(range(b0, b0 + need))
            alloc.key = ("psum", b0)
            return alloc.key
        if alloc.buffer == "sbuf":
            slots = self.sites.setdefault(alloc.site, [])
            self.site_first.setdefault(alloc.site, self._order + 1)
            free = [s for s in slots if _dead(s)]
            room = self.sbuf_bytes + alloc.bytes_pp <= self.sbuf_budget
            floor = 0.0
            if not room and len(slots) < cm.ALLOC_BUFFERS:
                floor = self._reclaim(alloc.site)
                room = self.sbuf_bytes + alloc.bytes_pp <= self.sbuf_budget
            if free and (len(slots) >= cm.ALLOC_BUFFERS or not room):
                slot = min(free, key=lambda s: s[2])  # the free buffer allocated longest ago
            else:
                self._serial += 1
                slot = [("sbuf", self._serial), None, 0, alloc.bytes_pp]
                slots.append(slot)
                self.sbuf_bytes += alloc.bytes_pp
                if floor:  # the memory of the buffers it replaces: their last accesses come first
                    reg = self.regions[slot[0]] = _Region()
                    reg.writes.append(_Access(0, PARTITIONS, 0, alloc.bytes_pp, None, floor, "sbuf"))
            slot[1] = weakref.ref(alloc)
            self._order += 1
            slot[2] = self._order
            alloc.key = slot[0]
            return alloc.key
        self._serial += 1
        alloc.key = ("hbm", self._serial, alloc.buffer)
        return alloc.key

    def _reclaim(self, site: Any) -> float:
        """Retire the buffers of allocation lines whose tiles are all dead and were all allocated before line ``site``
        first was (the compiler reuses the memory of tiles no longer live, e.g. an earlier loop's; lines still in use
        keep their rotation). Returns the end of the retired buffers' last accesses (0.0 if none)."""
        since = self.site_first[site]
        floor = 0.0
        for other, slots in list(self.sites.items()):
            if other == site or not slots or not all(_dead(s) and s[2] < since for s in slots):
                continue
            del self.sites[other]
            for s in slots:
                self.sbuf_bytes -= s[3]
                reg = self.regions.pop(s[0], None)
                if reg is not None:
                    floor = max([floor] + [a.end for a in reg.reads + reg.writes])
        return floor

    def _regions(self, t: Any) -> list[tuple[Any, int, int, int, int, Any]]:
        """(key, p0, p1, lo, hi, rows) boxes a view touches; ``rows`` = (stride, r0, r1, c0, c1) for two-level HBM."""
        alloc: Alloc = t.base
        key = self._key(alloc)
        shape, strides, off = t.shape, t.strides, t.offset
        if off is None:  # a runtime offset (register or per-partition index): anywhere in the allocation
            if alloc.buffer == "psum":
                return [(("psum", b), 0, 128, 0, 1, None) for b in alloc.banks]
            return [(key, 0, 128, -(1 << 62), 1 << 62, None)]
        if alloc.pstride:  # on chip: partition range x free element range within a partition
            p0 = off // alloc.pstride
            f = off - p0 * alloc.pstride
            lo = hi = f
            for n, s in zip(shape[1:], strides[1:], strict=False):
                if n > 1:
                    if s >= 0:
                        hi += (n - 1) * s
                    else:
                        lo += (n - 1) * s
            p1 = p0 + (shape[0] if shape else 1)
            if alloc.buffer == "psum":
                size = alloc.itemsize
                b_lo = alloc.banks[0] + (lo * size) // PSUM_BANK_BYTES
                b_hi = alloc.banks[0] + ((hi + 1) * size - 1) // PSUM_BANK_BYTES
                return [(("psum", b), p0, p1, 0, 1, None) for b in range(b_lo, min(b_hi, PSUM_BANKS - 1) + 1)]
            return [(key, p0, p1, lo, hi + 1, None)]
        lo = hi = off
        dims = [(n, s) for n, s in zip(shape, strides, strict=False) if n > 1]
        for n, s in dims:
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        rows = None
        if len(dims) == 2 and dims[1][1] == 1 and dims[0][1] > 0:
            r_stride = dims[0][1]
            c0 = off % r_stride
            if c0 + dims[1][0] <= r_stride:
                r0 = off // r_stride
                rows = (r_stride, r0, r0 + dims[0][0], c0, c0 + dims[1][0])
        return [(key, 0, 1, lo, hi + 1, rows)]

    # ------------------------------------------------------------------------------------------- schedule
    def _ready(self, boxes_r: list[Any], boxes_w: list[Any], engine: str) -> float:
        ready = 0.0
        sem = 0.0 if engine.startswith("dma") else cm.SEMAPHORE_NS
        same = self.writeback.get(engine, 0.0)
        regions = self.regions
        for key, p0, p1, lo, hi, rows in boxes_r:
            reg = regions.get(key)
            if reg is None:
                continue
            for a in reg.writes:
                if a.end + sem > ready and a.overlaps(p0, p1, lo, hi, rows):
                    t = a.end + (same if a.engine == engine else sem)
                    if t > ready:
                        ready = t
        for key, p0, p1, lo, hi, rows in boxes_w:
            reg = regions.get(key)
            if reg is None:
                continue
            for lst in (reg.reads, reg.writes):
                for a in lst:
                    if a.end + sem > ready and a.overlaps(p0, p1, lo, hi, rows):
                        t = a.end if a.engine == engine else a.end + sem
                        if t > ready:
                            ready = t
        return ready

    def _record(self, boxes: list[Any], end: float, engine: str, write: bool) -> None:
        regions = self.regions
        for key, p0, p1, lo, hi, rows in boxes:
            reg = regions.get(key)
            if reg is None:
                reg = regions[key] = _Region()
            acc = _Access(p0, p1, lo, hi, rows, end, engine)
            if write:
                if rows is None:
                    reg.writes = [a for a in reg.writes if not (a.end <= end and acc.covers(a.p0, a.p1, a.lo, a.hi))]
                    reg.reads = [a for a in reg.reads if not (a.end <= end and acc.covers(a.p0, a.p1, a.lo, a.hi))]
                reg.writes.append(acc)
            else:
                if rows is None:
                    reg.reads = [a for a in reg.reads if not (a.end <= end and acc.covers(a.p0, a.p1, a.lo, a.hi))]
                reg.reads.append(acc)
            if key[0] == "hbm" and len(reg.writes) + len(reg.reads) > 64:
                floor = min(self.free[q] for q in self.dma_queues)  # HBM is touched by DMAs only
                reg.writes = [a for a in reg.writes if a.end > floor]
                reg.reads = [a for a in reg.reads if a.end > floor]

    def boxes(self, reads: list[Any], writes: list[Any]) -> tuple[list[Any], list[Any]]:
        """The regions an instruction reads and writes. Resolving them assigns each allocation its physical buffer
        (at its first use, in program order): an iteration being fast-forwarded resolves its boxes as it runs, so
        the buffers and PSUM banks later instructions get are the ones scheduling every iteration gives."""
        return [b for t in reads for b in self._regions(t)], [b for t in writes for b in self._regions(t)]

    def issue(self, rec: InstructionRecord, reads: list[Any], writes: list[Any], line: int,
              queue: str | None = None, boxes: tuple[list[Any], list[Any]] | None = None) -> None:
        """Schedule one instruction (program order) on its queue (``queue``: a DMA's issue queue, when the kernel
        chose its engine: ``engine=nisa.engine.sync`` -> dma_q0, ``scalar`` -> dma_q1; ``boxes``: its regions when
        already resolved, see :meth:`boxes`)."""
        if self.end > self.budget_ns:
            raise OverBudget(f"makespan {self.end:.0f} ns passed the budget of {self.budget_ns:.0f} ns")
        self.scheduled += 1
        engine = rec.engine
        boxes_r, boxes_w = boxes if boxes is not None else self.boxes(reads, writes)
        if engine == cm.SEQUENCER:
            if rec.instruction != "register_load":
                return
            # a runtime branch: every queue drains, then the sequencer reads the flag
            start = max(self._ready(boxes_r, [], "sequencer"), self.end, *self.free.values())
            end = start + cm.REGISTER_LOAD_NS
            for q in self.free:
                self.free[q] = end
            self.end = max(self.end, end)
            self._trace("sequencer", start, end, rec, line)
            return
        if engine == "dma":
            end = self._dma(rec, boxes_r, boxes_w, line, queue)
            if rec.instruction in cm.SYNC_INSTRUCTIONS:
                self.sync.append(end)
            return
        if engine not in self.free:
            engine = "vector"
        if engine == "tensor":
            dur = cm.matmul_cycles(self.hw, rec) / self.ghz["tensor"]
        elif rec.instruction == "core_barrier":
            dur = cm.CORE_BARRIER_NS
        else:
            dur = cm.engine_cycles(self.hw, rec) / self.ghz[engine]
        start = max(self.free[engine], self._ready(boxes_r, boxes_w, engine))
        end = start + dur
        self.free[engine] = end
        self.busy[engine] += dur
        if end > self.end:
            self.end = end
        self._record(boxes_r, end, engine, False)
        self._record(boxes_w, end, engine, True)
        self._trace(engine, start, end, rec, line)
        if rec.instruction in cm.SYNC_INSTRUCTIONS:
            self.sync.append(end)

    def _dma(self, rec: InstructionRecord, boxes_r: list[Any], boxes_w: list[Any], line: int,
             queue: str | None = None) -> float:
        hw = self.hw
        if queue not in self.dma_queues:  # no engine= given: the compiler's choice, the first free queue
            queue = min(self.dma_queues, key=lambda q: self.free[q])
        issue = max(self.free[queue], self._ready(boxes_r, boxes_w, "dma"))
        self.free[queue] = issue + self.dge_ns
        data = issue + cm.DMA_START_LATENCY_NS
        cost = cm.dma_cost(hw, rec)
        piece = (cost.ns - cm.DMA_FIXED_NS)  # each engine's share of the bytes, at its derated bandwidth
        # the engines serving the transfer's partitions (8 partitions each)
        p0 = 0
        on_chip = next((x for x in (self._first_on_chip(boxes_w), self._first_on_chip(boxes_r)) if x is not None),
                       None)
        if on_chip is not None:
            p0 = on_chip
        first = min(hw.dma_engines - cost.engines, p0 // cm.PARTITIONS_PER_DMA_ENGINE)
        end = data
        for e in range(first, first + cost.engines):
            end = max(end, self.dma_engines[e].place(data, piece)[1])
        self.busy["dma"] += piece * cost.engines / hw.dma_engines
        if cost.hbm_bytes:
            h = cost.hbm_bytes * self.hbm_ns_per_byte
            end = max(end, self.hbm.place(data, h)[1])
            self.busy["hbm"] += h
        self._dmas += 1
        if self._dmas % 64 == 0:  # a later transfer starts its data no earlier than this
            floor = min(self.free[q] for q in self.dma_queues) + cm.DMA_START_LATENCY_NS
            for lane in (*self.dma_engines, self.hbm):
                lane.prune(floor)
        if end > self.end:
            self.end = end
        self._record(boxes_r, end, "dma", False)
        self._record(boxes_w, end, "dma", True)
        self._trace(queue, issue, end, rec, line)  # from its trigger to its last byte
        return end

    @staticmethod
    def _first_on_chip(boxes: list[Any]) -> int | None:
        for key, p0, *_ in boxes:
            if key[0] in ("sbuf", "psum"):
                return p0
        return None

    def _trace(self, queue: str, start: float, end: float, rec: InstructionRecord, line: int) -> None:
        if self.timeline is not None:
            self.timeline.append((queue, start, end, rec.instruction, line))

    # ------------------------------------------------------------------------------------------- loops
    def frontier(self) -> tuple[float, ...]:
        """Every queue's free time (compute engines, DMA issue queues, the busiest DMA engine, HBM)."""
        f = self.free
        queues = [f[q] for q in self.dma_queues]  # a pool: which queue a DMA takes alternates
        return (f["tensor"], f["vector"], f["scalar"], f["gpsimd"], min(queues), max(queues),
                max([lane.e[-1] if lane.e else 0.0 for lane in self.dma_engines]), self.hbm.last)

    def busy_snapshot(self) -> dict[str, float]:
        return dict(self.busy)

    def shift(self, blocks: int, after: float, busy: dict[str, float], iterations: int,
              advance: dict[str, float]) -> None:
        """``blocks`` repeats of a block of loop iterations (``iterations`` in all) are not scheduled one by one:
        every time later than ``after`` on a queue the block advanced moves forward by that queue's advance per
        block (``advance``, per :meth:`frontier` entry) times ``blocks``, and their
        busy time (``busy``, per iteration) is added."""
        self.skipped += iterations
        delta = {tag: d * blocks for tag, d in advance.items()}
        # region accesses end when their queue's work ends; a DMA's when its data has moved
        delta["dma"] = max(delta.get("dma_lanes", 0.0), delta.get("hbm", 0.0))
        delta["dma_q"] = max(delta.get("dma_q_first", 0.0), delta.get("dma_q_last", 0.0))
        for q, t in self.free.items():
            d = delta.get("dma_q" if q in DMA_QUEUES else q, 0.0)
            if t > after and d:
                self.free[q] = t + d
        if delta.get("dma_lanes"):
            for lane in self.dma_engines:
                if lane.last > after:  # the engines the repeated transfers used
                    lane.shift(after, delta["dma_lanes"])
        if delta.get("hbm"):
            self.hbm.shift(after, delta["hbm"])
        # Region entries keep their times: the sampled iterations' accesses happened when they happened (a later
        # loop reading what they wrote waits for exactly that), and the skipped iterations touched other regions
        # (or the same ones again, which the last iteration, always run, touches once more). A scratch HBM tensor
        # written here is read back whole later: its readers wait for the skipped iterations' writes too.
        lanes_end = max((lane.last for lane in self.dma_engines), default=0.0)
        self.end = max(self.end, lanes_end, self.hbm.last, *self.free.values())
        for key, reg in self.regions.items():
            if key[0] == "hbm" and key[2] != "shared_hbm" and any(a.end > after for a in reg.writes):
                reg.writes.append(_Access(0, 1, -(1 << 62), 1 << 62, None, max(lanes_end, self.hbm.last), "dma"))
        for e, b in busy.items():
            self.busy[e] += b * iterations

    def result(self) -> Schedule:
        return Schedule(self.target, self.end, dict(self.busy), self.scheduled, self.skipped, self.timeline,
                        list(self.sync))


def couple_programs(schedules: list[Schedule]) -> None:
    """The programs of an LNC2 launch meet at every core_barrier / sendrecv (the n-th of one core with the n-th of
    the other): a program that arrives first waits for its peer. Each program was scheduled alone, so after the
    n-th meeting its remaining work is shifted by how much later the peer got there (taken as delaying everything
    after it: an upper bound; it only ever adds time). Makespans are updated in place."""
    if len(schedules) != 2 or not all(s.sync_ns for s in schedules):
        return
    shift = [0.0, 0.0]
    for own0, own1 in zip(schedules[0].sync_ns, schedules[1].sync_ns, strict=False):
        met = max(own0 + shift[0], own1 + shift[1])
        shift = [met - own0, met - own1]
    for s, d in zip(schedules, shift, strict=True):
        s.makespan_ns += d
