"""A Trainium NeuronCore cost model: estimated kernel time from its instruction stream.

Input: simulator :class:`~neuron_compile.simulator.trace.InstructionRecord`\\ s (from a traced run, or
the analytic stream of :mod:`neuron_compile.instruction_stream`), as a list or a ``{record: count}``
mapping. Output: an :class:`Estimate` with per-engine busy time, a dependency term and the total.

Every constant and rule comes from AWS's public Neuron documentation (the NKI architecture guides,
the NKI Performance Guide, the DMA guides) and is listed with its source in ``docs/cost_model.md``. Where the sources disagree or say nothing the model takes the
slower choice. Engines (TensorE, VectorE, ScalarE, GpSimdE, the DMA queues) run concurrently, so a
kernel takes the busiest engine's time plus a dependency term: the other engines' work for one
tile, which a one-tile-deep software pipeline cannot hide (fill and drain), plus a full drain of
the engines for every ``register_load`` (a runtime branch input). Sequencer records (registers) take
no engine time.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_compile.simulator.trace import InstructionRecord

log = logging.getLogger(__name__)

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
HBM_BUFFERS = frozenset(("private_hbm", "shared_hbm", "hbm"))


@dataclass(frozen=True)
class Hardware:
    """Per-NeuronCore numbers of one Trainium generation (REFERENCE 4.1, 4.2)."""

    name: str
    nc_version: int
    pe_ghz: float  # TensorE clock
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    dma_engine_bytes_per_ns: float  # per DMA engine (DMABW table; the lower of table and text)
    dma_engines: int  # per NeuronCore
    hbm_chip_gbps_low: float  # the lower documented chip HBM bandwidth (estimates)
    hbm_chip_gbps_high: float  # the higher one (roofline)
    cores_per_chip: int

    @property
    def dma_aggregate_gbps(self) -> float:
        return self.dma_engine_bytes_per_ns * self.dma_engines

    @property
    def hbm_core_gbps_estimate(self) -> float:
        """HBM bandwidth one core can count on when every core streams (chip / cores)."""
        return self.hbm_chip_gbps_low / self.cores_per_chip

    @property
    def hbm_core_gbps_roofline(self) -> float:
        """Best case for the roofline: the higher chip figure per core, capped by the core's DMA engines."""
        return min(self.hbm_chip_gbps_high / self.cores_per_chip, self.dma_aggregate_gbps)

    def pe_flops_per_s(self, dtype: str) -> float:
        """TensorE peak: 128x128 PEs x 2 FLOP per cycle; fp32 4x slower, fp8 (double row) 2x faster."""
        base = 128 * 128 * 2 * self.pe_ghz * 1e9
        if dtype == "float32":
            return base / FP32_MATMUL_FACTOR
        if dtype.startswith("float8") and self.nc_version >= 3:
            return base * 2
        return base

    def elementwise_per_s(self, dtype: str) -> float:
        """Peak elements/s of Vector + Scalar + GpSimd together (128 partitions each, best perf mode)."""
        low = dtype in LOW_PRECISION
        v = VECTOR_PERF_MODE_MAX if (low and self.nc_version >= 3) else 1
        s = 2 if (low and self.nc_version >= 4) else 1
        return 128e9 * (self.vector_ghz * v + self.scalar_ghz * s + self.gpsimd_ghz)


HARDWARE: dict[str, Hardware] = {
    "trn1": Hardware("trn1", 2, 2.8, 1.12, 1.4, 1.4, 17.0, 16, 820.0, 820.0, 2),
    "trn2": Hardware("trn2", 3, 2.4, 0.96, 1.2, 1.2, 23.0, 16, 2900.0, 3000.0, 8),
    "trn3": Hardware("trn3", 4, 2.4, 1.2, 1.2, 1.2, 33.0, 16, 4700.0, 4900.0, 8),
}

@dataclass(frozen=True)
class Interconnect:
    """Collective-communication figures of one Trainium instance type (docs/cost_model.md, "Collectives")."""

    name: str
    link_gbps_per_chip: float  # chip-to-chip NeuronLink within an instance, GB/s per chip
    hop_latency_us: float  # per algorithm step within a node
    efa_gbps_per_chip: float  # the instance's EFA bandwidth shared by its chips, GB/s per chip
    efa_hop_latency_us: float  # per step across nodes
    chips_per_instance: int
    ranks_per_chip: int  # data-parallel ranks per chip at the default LNC=2
    chip_hbm_gbps: float  # an on-chip collective moves data through HBM


# trn2: Trn2 architecture page (intra-instance NeuronLink-v3 1,024 GB/s per chip; 16 chips; EFAv3 3,200 Gbps per
# instance = 400 GB/s / 16 chips), intra-node collectives guide (per-hop latency "about 1-2 us": 2 us taken),
# inter-node collectives guide ("~15 us" per hop), Trainium2 page (8 cores per chip, LNC=2: 4 ranks).
# trn1 (no published NeuronLink-v2 bandwidth) and trn3 (switched fabric, different topology) are not modelled.
INTERCONNECT: dict[str, Interconnect] = {
    "trn2": Interconnect("trn2", 1024.0, 2.0, 3200 / 8 / 16, 15.0, 16, 4, 2900.0),
}

# TensorE (REFERENCE 4.3 "TensorE", 4.4)
MM_INIT_LATENCY = 64  # minimum matmul initiation interval, PE cycles
FP32_MATMUL_FACTOR = 4  # fp32 operands: 4x the cycles
FP32_TRANSPOSE_FACTOR_V3 = 2  # NC-v3+ transpose mode: fp32 transposes 2x faster than the fp32 matmul rate
LS_SPEEDUP = 4  # LoadStationary is up to 4x faster than a moving pass of the same free size
# Vector / Scalar / GpSimd (REFERENCE 4.3 "VectorE / ScalarE", 4.4)
INSTRUCTION_OVERHEAD = 100  # engine cycles per instruction (the slow end of 64..100)
VECTOR_RECIPROCAL_CYCLES = 8  # VectorE reciprocal: 8 cycles per element
GPSIMD_RSQRT_FACTOR = 4  # GpSimd rsqrt 4x slower than ScalarE
WIDE_STRIDE_FACTOR = 1.5  # innermost free stride > 16 bytes: ~50% slower
WIDE_STRIDE_BYTES = 16
ACT_READ_ACCUMULATOR = 64  # ScalarE cycles to read the accumulation registers (activation_reduce)
VECTOR_PERF_MODE_MAX = 4
LOW_PRECISION = frozenset(("bfloat16", "float16"))
# DMA (REFERENCE 4.3 "DMA", 4.4; DMABW)
DMA_FIXED_NS = 1300.0  # per DMA instruction: descriptors + semaphore, "~1300 ns cross-engine"
PARTITIONS_PER_DMA_ENGINE = 8  # 128 partitions / 16 engines
DMA_FULL_CHUNK = 4096  # >= 4 KiB contiguous per partition: saturates the engines
DMA_NEAR_PEAK_CHUNK = 2048  # >= 2 KiB: "approaches peak" (taken as 90% of peak)
DMA_NEAR_PEAK_EFFICIENCY = 0.9
# Per-packet overhead as bytes of transfer time, so that a 2 KiB packet runs at 90% of peak (~228 B).
DMA_PACKET_OVERHEAD_BYTES = DMA_NEAR_PEAK_CHUNK * (1 / DMA_NEAR_PEAK_EFFICIENCY - 1)
CONVERT_VIA_FP32_BYTES = 4  # dtype-converting DMAs go through fp32
# Sequencer registers (REFERENCE 1.5 "Runtime loops", 3.6). register_load feeds a runtime branch: every
# engine drains before the sequencer reads the value. Not documented; ~1.3 us cross-engine semaphore (the
# DMA fixed cost's figure) + the scalar read, taken as 2 us (conservative). alloc/move/store: no datapath.
REGISTER_LOAD_NS = 2000.0
SEQUENCER = "sequencer"

_ITEMSIZE = {"float32": 4, "tfloat32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2,
             "uint16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3": 1, "float8_e4m3fn": 1,
             "float8_e5m2": 1, "float8e4": 1, "float8e5": 1, "int64": 8, "float64": 8}


def itemsize(dtype: str) -> int:
    size = _ITEMSIZE.get(str(dtype))
    if size is None:
        raise KeyError(f"cost model: unknown dtype {dtype!r}")
    return size


def hardware(target: str) -> Hardware:
    try:
        return HARDWARE[target]
    except KeyError:
        raise ValueError(f"cost model: unknown target {target!r}; expected one of {sorted(HARDWARE)}") from None


# ----------------------------------------------------------------------------------------------- engines


def matmul_cycles(hw: Hardware, rec: InstructionRecord) -> float:
    """PE cycles of one nc_matmul / TensorE nc_transpose: max(LoadStationary, MultiplyMoving)."""
    if rec.instruction == "nc_transpose":  # a matmul against the identity: stationary = data [P, F]
        p, f = rec.shapes[1][0], math.prod(rec.shapes[1][1:])
        m, n, dtype, transpose, double = f, p, rec.dtypes[1], True, False
    else:
        m, n = rec.partitions, rec.free_size
        dtype, transpose, double = rec.dtypes[1], "is_transpose" in rec.flags, "double_row" in rec.flags
    factor = 1.0
    if dtype == "float32":
        factor = FP32_TRANSPOSE_FACTOR_V3 if (transpose and hw.nc_version >= 3) else FP32_MATMUL_FACTOR
    mm = max(n, MM_INIT_LATENCY) * factor
    if double:
        mm /= 2
    ls = m / LS_SPEEDUP * factor
    return max(mm, ls)


def _contiguous_inner(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return not shape or len(shape) < 2 or shape[-1] == 1 or strides[-1] == 1


def _inner_stride_bytes(rec: InstructionRecord) -> int:
    worst = 0
    for shape, strides, dt in zip(rec.shapes, rec.strides, rec.dtypes, strict=False):
        if len(shape) >= 2 and shape[-1] > 1:
            worst = max(worst, abs(strides[-1]) * itemsize(dt))
    return worst


def _vector_speedup(hw: Hardware, rec: InstructionRecord) -> float:
    """NC-v3+ VectorE perf modes (automatic): tensor_copy / tensor_scalar 4x or 2x, tensor_tensor 2x."""
    if hw.nc_version < 3 or not rec.dtypes or any(d not in LOW_PRECISION for d in rec.dtypes):
        return 1.0
    in_psum = "psum" in rec.buffers
    if rec.instruction in ("tensor_copy", "tensor_scalar"):
        contiguous = all(_contiguous_inner(s, st) for s, st in zip(rec.shapes, rec.strides, strict=False))
        return 4.0 if (contiguous and not in_psum) else 2.0
    if rec.instruction == "tensor_tensor" and all(b == "sbuf" for b in rec.buffers[1:]):
        return 2.0
    return 1.0


_TWO_INPUT = frozenset(("tensor_tensor", "scalar_tensor_tensor", "tensor_copy_predicated", "tensor_tensor_scan",
                        "select_reduce"))


def engine_cycles(hw: Hardware, rec: InstructionRecord) -> float:
    """Vector / Scalar / GpSimd cycles: fixed overhead + elements per partition x inputs / speed-up."""
    n = rec.free_size
    inputs = 2 if rec.instruction in _TWO_INPUT else 1
    work = float(n * inputs)
    if rec.engine == "vector":
        if rec.instruction == "reciprocal":
            work = n * VECTOR_RECIPROCAL_CYCLES
        elif rec.instruction == "tensor_scalar_reduce":
            work += ACT_READ_ACCUMULATOR  # the accumulator read-out, taken at ScalarE's cost (conservative)
        elif rec.instruction == "exponential" and hw.nc_version >= 4:
            work = n / 4  # NC-v4 VectorE exponential: 4x ScalarE exp
        else:
            work /= _vector_speedup(hw, rec)
    elif rec.engine == "scalar":
        if hw.nc_version >= 4 and rec.instruction in ("tensor_scalar", "tensor_copy") \
                and all(d in LOW_PRECISION for d in rec.dtypes):
            work /= 2  # NC-v4 ScalarE bf16 mode
        if rec.instruction == "activation_reduce":
            work += ACT_READ_ACCUMULATOR
    elif rec.engine == "gpsimd" and rec.instruction == "tensor_scalar":
        work *= GPSIMD_RSQRT_FACTOR  # GpSimd tensor_scalar is rsqrt only
    if _inner_stride_bytes(rec) > WIDE_STRIDE_BYTES:
        work *= WIDE_STRIDE_FACTOR
    return INSTRUCTION_OVERHEAD + work


def _run_bytes(shape: tuple[int, ...], strides: tuple[int, ...], size: int) -> int:
    """Bytes of the innermost contiguous run of one partition's row (dims after the first)."""
    run = 1
    expect = 1
    for d in range(len(shape) - 1, 0, -1):
        if shape[d] == 1:
            continue
        if strides[d] != expect:
            break
        run *= shape[d]
        expect = strides[d] * shape[d]
    return run * size


def dma_efficiency(chunk_bytes: float) -> float:
    """Fraction of an engine's peak reached with ``chunk_bytes`` contiguous per partition.

    >= 4 KiB saturates; below, every packet pays a fixed overhead worth ~228 B of transfer time:
    ``c / (c + 228)`` (2 KiB -> 90%, 256 B -> 53%, 64 B -> 22%, 4 B -> 1.7%).
    """
    if chunk_bytes >= DMA_FULL_CHUNK:
        return 1.0
    c = max(float(chunk_bytes), 1.0)
    return c / (c + DMA_PACKET_OVERHEAD_BYTES)


@dataclass(frozen=True)
class DmaCost:
    ns: float  # latency of the transfer (fixed cost + data)
    engines: int
    moved_bytes: int
    hbm_bytes: int  # bytes read from + written to HBM


def dma_cost(hw: Hardware, rec: InstructionRecord) -> DmaCost:
    """``1.3 us + bytes / (BW_engine x engines x efficiency)``, engines = min(16, ceil(P / 8))."""
    parts = max(rec.partitions, 1)
    elements = parts * rec.free_size
    converting = len(set(rec.dtypes)) > 1
    size = max(itemsize(d) for d in rec.dtypes) if rec.dtypes else 4
    if converting:
        size = max(size, CONVERT_VIA_FP32_BYTES)
    moved = elements * size
    per_partition = rec.free_size * size
    chunk = per_partition
    for shape, strides, dt in zip(rec.shapes, rec.strides, rec.dtypes, strict=False):
        chunk = min(chunk, _run_bytes(shape, strides, size if converting else itemsize(dt)))
    engines = min(hw.dma_engines, max(1, math.ceil(parts / PARTITIONS_PER_DMA_ENGINE)))
    data_ns = moved / (hw.dma_engine_bytes_per_ns * engines * dma_efficiency(chunk)) if moved else 0.0
    hbm = sum(math.prod(s) * itemsize(d) for s, d, b in zip(rec.shapes, rec.dtypes, rec.buffers, strict=False)
              if b in HBM_BUFFERS)
    return DmaCost(DMA_FIXED_NS + data_ns, engines, moved, hbm)


# ---------------------------------------------------------------------------------------------- estimate


@dataclass
class Estimate:
    """Estimated time of one kernel (or a sum of kernels) on one NeuronCore."""

    target: str
    engine_ns: dict[str, float] = field(default_factory=dict)
    dependency_ns: float = 0.0
    instructions: dict[str, int] = field(default_factory=dict)  # per engine
    dma_transfers: int = 0
    hbm_bytes: int = 0  # actual HBM traffic of the DMAs
    store_tiles: int = 0  # DMAs writing HBM (one per finished output tile)
    executed_flops: int = 0  # TensorE 2*K*M*N per matmul (transposes excluded)

    @property
    def time_ns(self) -> float:
        return (max(self.engine_ns.values()) if self.engine_ns else 0.0) + self.dependency_ns

    @property
    def bottleneck(self) -> str:
        return max(self.engine_ns, key=lambda e: self.engine_ns[e]) if self.engine_ns else "-"

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "time_ns": self.time_ns, "engine_ns": dict(self.engine_ns),
                "dependency_ns": self.dependency_ns, "bottleneck": self.bottleneck,
                "instructions": dict(self.instructions), "dma_transfers": self.dma_transfers,
                "hbm_bytes": self.hbm_bytes, "executed_flops": self.executed_flops}

    def __add__(self, other: Estimate) -> Estimate:
        """Kernels run one after the other: a sum of times (kept as per-engine sums + dependency sums)."""
        out = Estimate(self.target)
        for e in set(self.engine_ns) | set(other.engine_ns):
            out.engine_ns[e] = self.engine_ns.get(e, 0.0) + other.engine_ns.get(e, 0.0)
        for e in set(self.instructions) | set(other.instructions):
            out.instructions[e] = self.instructions.get(e, 0) + other.instructions.get(e, 0)
        # Sequential kernels: the sum of their times, not the max of summed engines.
        out.dependency_ns = self.time_ns + other.time_ns - (max(out.engine_ns.values()) if out.engine_ns else 0.0)
        out.dma_transfers = self.dma_transfers + other.dma_transfers
        out.hbm_bytes = self.hbm_bytes + other.hbm_bytes
        out.store_tiles = self.store_tiles + other.store_tiles
        out.executed_flops = self.executed_flops + other.executed_flops
        return out


def _as_counts(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int]) -> Mapping[InstructionRecord, int]:
    if isinstance(records, Mapping):
        return records
    return Counter(records)


def estimate(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int], target: str = "trn2") -> Estimate:
    """Estimated time of one kernel's instruction stream (a list, or ``{record: count}``).

    An ordered stream (a list, e.g. a simulator trace) is split after every ``register_load``: a runtime branch
    waits for every engine, so the parts run one after the other (their estimates add). A ``{record: count}``
    mapping has no order: pass its parts separately (``instruction_stream.kernel_segments``)."""
    if not isinstance(records, Mapping):
        records = list(records)
        cuts = [i + 1 for i, r in enumerate(records) if r.instruction == "register_load"]
        if cuts and cuts[0] < len(records):
            bounds = [0] + cuts + [len(records)]
            return total([_estimate(records[a:b], target) for a, b in zip(bounds, bounds[1:]) if b > a], target)
    return _estimate(records, target)


def _estimate(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int], target: str) -> Estimate:
    hw = hardware(target)
    counts = _as_counts(records)
    busy = dict.fromkeys(ENGINES, 0.0)
    out = Estimate(target, instructions=dict.fromkeys(ENGINES, 0))
    dma_engine_ns = 0.0
    branch_ns = 0.0
    for rec, count in counts.items():
        if rec.engine == SEQUENCER:  # no engine time; a register_load is a full drain before a branch
            out.instructions[SEQUENCER] = out.instructions.get(SEQUENCER, 0) + count
            if rec.instruction == "register_load":
                branch_ns += REGISTER_LOAD_NS * count
            continue
        eng = rec.engine if rec.engine in busy else "vector"
        out.instructions[eng] += count
        if rec.engine == "dma":
            c = dma_cost(hw, rec)
            # A transfer holds its engines for its whole latency; 16 engines share the work.
            dma_engine_ns += c.ns * c.engines * count
            out.dma_transfers += count
            out.hbm_bytes += c.hbm_bytes * count
            if rec.buffers and rec.buffers[0] in HBM_BUFFERS:
                out.store_tiles += count
        elif rec.engine == "tensor":
            busy["tensor"] += matmul_cycles(hw, rec) / hw.pe_ghz * count
            if rec.instruction == "nc_matmul" and "is_transpose" not in rec.flags:
                k = rec.shapes[1][0] * (2 if "double_row" in rec.flags else 1)
                out.executed_flops += 2 * k * rec.partitions * rec.free_size * count
        else:
            ghz = {"vector": hw.vector_ghz, "scalar": hw.scalar_ghz, "gpsimd": hw.gpsimd_ghz}.get(rec.engine,
                                                                                                  hw.vector_ghz)
            busy[eng] += engine_cycles(hw, rec) / ghz * count
    # The DMA queues: engine-time over 16 engines, and never faster than this core's share of HBM.
    busy["dma"] = max(dma_engine_ns / hw.dma_engines, out.hbm_bytes / hw.hbm_core_gbps_estimate)
    out.engine_ns = busy
    top = max(busy.values())
    rest = sum(busy.values()) - top
    out.dependency_ns = rest / max(1, out.store_tiles) + branch_ns
    return out


def estimate_kernels(streams: Iterable[Iterable[InstructionRecord] | Mapping[InstructionRecord, int]],
                     target: str = "trn2") -> list[Estimate]:
    return [estimate(s, target) for s in streams]


def total(estimates: Iterable[Estimate], target: str = "trn2") -> Estimate:
    """Kernels of a graph run one after the other."""
    acc = Estimate(target)
    for e in estimates:
        acc = acc + e
    return acc
