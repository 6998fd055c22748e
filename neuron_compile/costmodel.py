"""A Trainium NeuronCore cost model: per-instruction costs, the scheduling estimate, and the first-order figure.

Input: simulator :class:`~neuron_compile.simulator.trace.InstructionRecord`\\ s. A scheduled
:class:`~neuron_compile.instruction_stream.Stream` (the analytic stream of a rendered kernel, its instructions in
program order with the buffers they touch) is estimated by the list scheduler of :mod:`neuron_compile.scheduler`;
bare records (a simulator trace, a ``{record: count}`` mapping) only by the first-order model (busiest engine + a
dependency term). Output: an :class:`Estimate`.

Every constant cites the AWS Neuron document it comes from (by title and section), or says it is fitted or assumed;
``docs/cost_model.md`` lists them and ``docs/calibration.md`` compares the model with AWS's published measurements.
Documents: the "Trainium/Inferentia2", "Trainium2" and "Trainium3" architecture guides of NKI (engines, clocks,
TensorE performance, DGE), the "Trainium", "Trainium2", "Trainium3" chip pages (chip TFLOPS, HBM), "NKI Performance
Optimizations" (Opt #5a, #7, #9), "NKI DMA overview", "NKI DMA Bandwidth Guide", and the NKI API "common settings"
page (engine selection costs).
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
    """Per-NeuronCore numbers of one Trainium generation (the architecture guides' engine and memory sections,
    the chip pages' HBM bandwidth, the DMA overview's per-engine bandwidth table)."""

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
        """TensorE peak from the clock ("Trainium/Trainium2/Trainium3 Architecture Guide", TensorE): 128x128 PEs x 2
        FLOP per cycle; fp32 4x slower; fp8 2x faster on NC-v3 (double row: 158 TFLOPS); on NC-v4 MXFP8/MXFP4 4x
        (8x128 inputs per cycle: 315 TFLOPS) and plain fp8 at the bf16 rate (2x128 non-MX inputs)."""
        base = 128 * 128 * 2 * self.pe_ghz * 1e9
        if dtype == "float32":
            return base / FP32_MATMUL_FACTOR
        if dtype in MX_DTYPES and self.nc_version >= 4:
            return base * 4
        if dtype.startswith("float8") and self.nc_version == 3:
            return base * 2
        return base

    def pe_flops_chip_per_s(self, dtype: str) -> float:
        """TensorE peak per core from the chip's dense TFLOPS ("Trainium", "Trainium2", "Trainium3" chip pages) over
        its cores: trn2 bf16 667 / 8 = 83.4 TFLOPS, a little above the clock figure (78.6)."""
        table = CHIP_TFLOPS[self.name]
        if dtype == "float32":
            key = "float32"
        elif dtype in MX_DTYPES or dtype.startswith("float8"):
            key = "fp8" if self.nc_version < 4 or dtype in MX_DTYPES else "bfloat16"
        else:
            key = "bfloat16"
        return table[key] * 1e12 / self.cores_per_chip

    def pe_roofline_per_s(self, dtype: str) -> float:
        """The roofline's TensorE peak: the higher of the two documented figures (best case)."""
        return max(self.pe_flops_per_s(dtype), self.pe_flops_chip_per_s(dtype))

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

# Chip dense TFLOPS ("Trainium", "Trainium2", "Trainium3" chip pages of the Neuron hardware documentation): trn1's
# cFP8 runs at the bf16 rate; trn3's fp8 figure is MXFP8/MXFP4.
CHIP_TFLOPS = {"trn1": {"bfloat16": 190.0, "float32": 47.5, "fp8": 190.0},
               "trn2": {"bfloat16": 667.0, "float32": 181.0, "fp8": 1299.0},
               "trn3": {"bfloat16": 671.0, "float32": 183.0, "fp8": 2517.0}}
MX_DTYPES = frozenset(("mxfp8", "mxfp4", "float8_mx", "float4_mx"))


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

# TensorE ("Trainium/Inferentia2 Architecture Guide", TensorE "Performance Consideration"; "NKI Performance
# Optimizations", Opt #7 fast LoadStationary; "Trainium2 Architecture Guide": fp32 transpose mode)
MM_INIT_LATENCY = 64  # minimum matmul initiation interval, PE cycles
FP32_MATMUL_FACTOR = 4  # fp32 operands: 4x the cycles
FP32_TRANSPOSE_FACTOR_V3 = 2  # NC-v3+ transpose mode: fp32 transposes 2x faster than the fp32 matmul rate
LS_SPEEDUP = 4  # LoadStationary is up to 4x faster than a moving pass of the same free size
# Vector / Scalar / GpSimd ("Trainium/Inferentia2 Architecture Guide", VectorE/ScalarE performance: ~N cycles per
# input tile plus a fixed ~100-cycle overhead; NKI API common settings, engine selection: reciprocal and rsqrt costs;
# "Trainium2/3 Architecture Guide": perf modes)
INSTRUCTION_OVERHEAD = 100  # engine cycles per instruction (the slow end of 64..100)
VECTOR_RECIPROCAL_CYCLES = 8  # VectorE reciprocal: 8 cycles per element
GPSIMD_RSQRT_FACTOR = 4  # GpSimd rsqrt 4x slower than ScalarE
WIDE_STRIDE_FACTOR = 1.5  # innermost free stride > 16 bytes: ~50% slower
WIDE_STRIDE_BYTES = 16
ACT_READ_ACCUMULATOR = 64  # ScalarE cycles to read the accumulation registers (activation_reduce)
VECTOR_PERF_MODE_MAX = 4
VECTOR_WIDE_V3 = 2.0  # NC-v3+ VectorE: 256 elements per cycle for other dtypes = 2 per partition
LOW_PRECISION = frozenset(("bfloat16", "float16"))
# DMA ("NKI DMA overview": 16 engines, 8 partitions each, 17/23/33 B/ns per engine; "NKI DMA Bandwidth Guide":
# ~1300 ns fixed, payload size vs bandwidth)
DMA_FIXED_NS = 1300.0  # per DMA instruction: descriptors + semaphore, "~1300 ns cross-engine"
PARTITIONS_PER_DMA_ENGINE = 8  # 128 partitions / 16 engines
DMA_FULL_CHUNK = 4096  # >= 4 KiB contiguous per partition: saturates the engines
DMA_NEAR_PEAK_CHUNK = 2048  # >= 2 KiB: "approaches peak" (taken as 90% of peak)
DMA_NEAR_PEAK_EFFICIENCY = 0.9
# Per-packet overhead as bytes of transfer time, so that a 2 KiB packet runs at 90% of peak (~228 B).
DMA_PACKET_OVERHEAD_BYTES = DMA_NEAR_PEAK_CHUNK * (1 / DMA_NEAR_PEAK_EFFICIENCY - 1)
CONVERT_VIA_FP32_BYTES = 4  # dtype-converting DMAs go through fp32
# Sequencer registers (NKI language guide, runtime loops; nki.isa register_*). register_load feeds a runtime branch: every
# engine drains before the sequencer reads the value. Not documented; ~1.3 us cross-engine semaphore (the
# DMA fixed cost's figure) + the scalar read, taken as 2 us (conservative). alloc/move/store: no datapath.
REGISTER_LOAD_NS = 2000.0
SEQUENCER = "sequencer"

# ---- the scheduling model (neuron_compile.scheduler); every number cites its AWS document or says "assumed"
# Dependent-instruction issue interval: back-to-back one-element ScalarE instructions with a read-after-write
# dependency start every ~264 cycles on NC-v2 (189 ns) and ~266 ScalarE cycles on NC-v3 (222 ns): "NKI Performance
# Optimizations" guide, Opt #5a. The instruction itself costs INSTRUCTION_OVERHEAD of them, so a consumer on the same
# engine waits DEP_II - INSTRUCTION_OVERHEAD cycles after its producer ends (the write-back before the read).
DEP_II_CYCLES = {2: 264, 3: 266, 4: 266}
# Cross-engine wait on a compute engine's completion semaphore ("NKI Performance Optimizations", Opt #3: engines
# synchronise through semaphores). Not documented as a number: assumed to equal the same-engine write-back wait
# at a 1.2 GHz engine clock, ~140 ns.
SEMAPHORE_NS = 140.0
# DMA issue: a dma_copy occupies its issue queue while its descriptors are generated. NC-v3 has two hardware DGE
# instances, commanded from SyncE or ScalarE ("Trainium2 Architecture Guide", "Descriptor Generation Engine (DGE)":
# "about 600 ns" per DMA instruction; the "NKI DGE" deep dive: "hwdge ~600 ns per instruction"); the compiler
# picks which one, so a DMA takes whichever queue frees first. Per queue, fitted: 876 ns per DMA reproduces the
# "NKI DMA overview" throughput-vs-bytes-per-partition figure (flat transfer time up to 2 KiB per partition, the
# knee at 2 KiB: 81% of the 32 KiB throughput) if its loads were issued from one queue (docs/calibration.md). NC-v2
# has no hardware DGE (static descriptors): one queue, at the same fitted cost (assumed; the Trn1 matmul
# tutorial's tiled kernel agrees within 10%, docs/calibration.md).
DGE_ISSUE_NS = {2: 876.0, 3: 876.0, 4: 876.0}
DMA_ISSUE_QUEUES = {2: 1, 3: 2, 4: 2}
# Latency from the trigger to the data moving: "descriptor setup, synchronization, and semaphore-to-start latency
# (~1300 ns cross-engine)" ("NKI DMA Bandwidth Guide", "Why Large Contiguous DMA Payloads Are Required"). It
# overlaps other transfers: a lone 32 KiB transfer on one engine takes 1416 ns of engine time ("NKI DMA overview",
# Example 1), i.e. its bytes at 23 B/ns.
DMA_START_LATENCY_NS = DMA_FIXED_NS
# Cross-core synchronisation of an LNC2 launch. nisa.core_barrier writes a semaphore on the other core and waits for
# the peer's ("nki.isa.core_barrier": "remote semaphore update" then "local semaphore wait"): no figure is
# published; assumed to take one cross-engine semaphore-to-start latency (DMABW's ~1300 ns) on its engine.
# nisa.sendrecv moves its tile to the peer core by DMA ("nki.isa.sendrecv": "using DMA engines"): costed as an
# SBUF-to-SBUF dma_copy of that tile (issue, start latency, bytes). In both, a program cannot pass the instruction
# before its peer reaches it: instruction_stream couples the programs' schedules at every such instruction.
CORE_BARRIER_NS = DMA_START_LATENCY_NS
SYNC_INSTRUCTIONS = ("core_barrier", "sendrecv")
# Kernel launch and final drain: not documented; assumed one DMA start latency + a semaphore round per kernel.
KERNEL_LAUNCH_NS = DMA_FIXED_NS + 2 * SEMAPHORE_NS
# nisa.dma_transpose moves its bytes at up to ~90% of a copy's throughput from HBM and ~50% from SBUF ("Trainium2
# Architecture Guide", DMA transpose; the nisa.dma_transpose docs: best with 128 output partitions and an innermost
# free size a multiple of 16, the shapes the code generator uses). Charged on top of the derating of the source's
# contiguous runs (its rows, <= 128 elements: 256 B at bf16), so a transposing load is never cheaper than the same
# bytes copied with the same runs. Keyed by "the source is in HBM".
DMA_TRANSPOSE_FRACTION = {True: 0.9, False: 0.5}
# Double buffering: a tile allocated inside a loop rotates among this many physical buffers of its allocation site
# (an allocator choice, not documented; the "NKI Performance Optimizations" guide, Opt #2 gotchas, only says
# tiles declared inside the loop let the compiler multi-buffer). Assumed 2, within SBUF capacity.
ALLOC_BUFFERS = 4

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
    """NC-v3+ VectorE: 256 elements per cycle for 4-byte dtypes ("Trainium2 Architecture Guide", VectorE: 512 bf16/fp16
    and 256 other elements per cycle, i.e. 2 per partition), and the automatic bf16/fp16 perf modes: tensor_copy /
    tensor_scalar 4x or 2x, tensor_tensor 2x (of the 1 element per cycle NC-v2 rate)."""
    if hw.nc_version < 3 or not rec.dtypes:
        return 1.0
    if any(d not in LOW_PRECISION for d in rec.dtypes):
        return VECTOR_WIDE_V3
    in_psum = "psum" in rec.buffers
    if rec.instruction in ("tensor_copy", "tensor_scalar"):
        contiguous = all(_contiguous_inner(s, st) for s, st in zip(rec.shapes, rec.strides, strict=False))
        return 4.0 if (contiguous and not in_psum) else 2.0
    if rec.instruction == "tensor_tensor" and all(b == "sbuf" for b in rec.buffers[1:]):
        return 2.0
    return VECTOR_WIDE_V3


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
            # a tensor_scalar at VectorE's width for its dtypes, plus the accumulator read-out at ScalarE's cost
            # (conservative: charged whether or not the instruction reads the accumulators out)
            work = work / _vector_speedup(hw, rec) + ACT_READ_ACCUMULATOR
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
    efficiency = dma_efficiency(chunk)
    if rec.instruction == "dma_transpose":  # the source's runs (its last dim), at the transpose's share of a copy
        src_shape, src_strides = rec.shapes[-1], rec.strides[-1]
        run = itemsize(rec.dtypes[-1]) * (src_shape[-1] if src_strides and src_strides[-1] == 1 else 1)
        efficiency = dma_efficiency(run) * DMA_TRANSPOSE_FRACTION[rec.buffers[-1] in HBM_BUFFERS]
    if rec.instruction == "dma_compute":
        # every source streams through the DMA engine, which writes dst ("nki.isa.dma_compute": "reduction across
        # multiple source tensors"); a scatter-RMW's HBM rows are one of its sources (read, then written back).
        # Assumed: each source costs the bytes of a copy of the same rows (no figure is published).
        moved *= max(1, len(rec.shapes) - 1)
    engines = min(hw.dma_engines, max(1, math.ceil(parts / PARTITIONS_PER_DMA_ENGINE)))
    data_ns = moved / (hw.dma_engine_bytes_per_ns * engines * efficiency) if moved else 0.0
    hbm = sum(math.prod(s) * itemsize(d) for s, d, b in zip(rec.shapes, rec.dtypes, rec.buffers, strict=False)
              if b in HBM_BUFFERS)
    return DmaCost(DMA_FIXED_NS + data_ns, engines, moved, hbm)


# ---------------------------------------------------------------------------------------------- estimate


@dataclass
class Estimate:
    """Estimated time of one kernel (or a sum of kernels).

    From a scheduled stream (:class:`~neuron_compile.instruction_stream.Stream`): ``time_ns`` is the scheduler's
    makespan plus the kernel launch (``scheduled_ns``), ``engine_ns`` each queue's busy time per core, and
    ``first_order_ns`` the old first-order figure for comparison. From bare records (a list or ``{record: count}``)
    only the first-order model applies: the busiest engine + ``dependency_ns``."""

    target: str
    engine_ns: dict[str, float] = field(default_factory=dict)
    dependency_ns: float = 0.0
    instructions: dict[str, int] = field(default_factory=dict)  # per engine
    dma_transfers: int = 0
    hbm_bytes: int = 0  # actual HBM traffic of the DMAs
    store_tiles: int = 0  # DMAs writing HBM (one per finished output tile)
    executed_flops: int = 0  # TensorE 2*K*M*N per matmul (transposes excluded)
    scheduled_ns: float | None = None  # makespan + launch (None: not scheduled)
    first_order: float | None = None  # the first-order figure of a scheduled estimate
    programs: int = 1  # cores of the launch grid

    @property
    def time_ns(self) -> float:
        if self.scheduled_ns is not None:
            return self.scheduled_ns
        return (max(self.engine_ns.values()) if self.engine_ns else 0.0) + self.dependency_ns

    @property
    def first_order_ns(self) -> float:
        if self.first_order is not None:
            return self.first_order
        return (max(self.engine_ns.values()) if self.engine_ns else 0.0) + self.dependency_ns

    @property
    def bottleneck(self) -> str:
        return max(self.engine_ns, key=lambda e: self.engine_ns[e]) if self.engine_ns else "-"

    def occupancy(self) -> dict[str, float]:
        """Busy fraction of each queue over the estimated time (per core)."""
        t = self.time_ns
        return {e: (v / t if t else 0.0) for e, v in self.engine_ns.items()}

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "time_ns": self.time_ns, "engine_ns": dict(self.engine_ns),
                "dependency_ns": self.dependency_ns, "bottleneck": self.bottleneck,
                "instructions": dict(self.instructions), "dma_transfers": self.dma_transfers,
                "hbm_bytes": self.hbm_bytes, "executed_flops": self.executed_flops,
                "scheduled": self.scheduled_ns is not None, "first_order_ns": self.first_order_ns,
                "occupancy": self.occupancy(), "programs": self.programs}

    def __add__(self, other: Estimate) -> Estimate:
        """Kernels run one after the other: a sum of times (kept as per-engine sums + dependency sums)."""
        out = Estimate(self.target)
        for e in set(self.engine_ns) | set(other.engine_ns):
            out.engine_ns[e] = self.engine_ns.get(e, 0.0) + other.engine_ns.get(e, 0.0)
        for e in set(self.instructions) | set(other.instructions):
            out.instructions[e] = self.instructions.get(e, 0) + other.instructions.get(e, 0)
        # Sequential kernels: the sum of their times, not the max of summed engines.
        out.dependency_ns = self.time_ns + other.time_ns - (max(out.engine_ns.values()) if out.engine_ns else 0.0)
        if self.scheduled_ns is not None or other.scheduled_ns is not None:
            out.scheduled_ns = self.time_ns + other.time_ns
            out.first_order = self.first_order_ns + other.first_order_ns
        out.dma_transfers = self.dma_transfers + other.dma_transfers
        out.hbm_bytes = self.hbm_bytes + other.hbm_bytes
        out.store_tiles = self.store_tiles + other.store_tiles
        out.executed_flops = self.executed_flops + other.executed_flops
        out.programs = max(self.programs, other.programs)
        return out


def _as_counts(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int]) -> Mapping[InstructionRecord, int]:
    if isinstance(records, Mapping):
        return records
    return Counter(records)


def estimate(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int], target: str | None = None
             ) -> Estimate:
    """Estimated time of one kernel.

    A scheduled :class:`~neuron_compile.instruction_stream.Stream` (``kernel_stream`` / ``source_stream``) gives the
    scheduling model's estimate (:mod:`neuron_compile.scheduler`): the slowest program's makespan plus the kernel
    launch, with its first-order figure alongside. Bare records (a list, e.g. a simulator trace, or
    ``{record: count}``) carry no buffer identities, so they get the first-order model (:func:`first_order`)."""
    schedules = getattr(records, "schedules", None)
    if schedules:
        stream_target = getattr(records, "target", None)
        if target is not None and stream_target is not None and target != stream_target:
            raise ValueError(f"cost model: this stream was scheduled for {stream_target}, not {target}; "
                             f"pass target= to kernel_stream/source_stream")
        return _scheduled(records, schedules, stream_target or target or "trn2")  # type: ignore[arg-type]
    return first_order(records, target or "trn2")


def _scheduled(counts: Mapping[InstructionRecord, int], schedules: list[Any], target: str) -> Estimate:
    programs = len(schedules)
    fo = _estimate(counts, target)
    out = Estimate(target, instructions=fo.instructions, dma_transfers=fo.dma_transfers, hbm_bytes=fo.hbm_bytes,
                   store_tiles=fo.store_tiles, executed_flops=fo.executed_flops, programs=programs)
    busy: dict[str, float] = {}
    for s in schedules:
        for e, v in s.busy_ns.items():
            busy[e] = busy.get(e, 0.0) + v / programs
    dma = max(busy.pop("dma", 0.0), busy.pop("hbm", 0.0))
    out.engine_ns = {**busy, "dma": dma}
    out.scheduled_ns = max(s.makespan_ns for s in schedules) + KERNEL_LAUNCH_NS
    # the first-order figure of the same work spread over the programs (each core its share)
    out.first_order = fo.time_ns / programs
    return out


def first_order(records: Iterable[InstructionRecord] | Mapping[InstructionRecord, int], target: str = "trn2"
                ) -> Estimate:
    """The first-order model (the pre-scheduler estimate, kept for comparison): per-engine busy sums, the busiest
    engine + a dependency term (the other engines' work over the number of output stores).

    An ordered stream (a list, e.g. a simulator trace) is split after every ``register_load``: a runtime branch
    waits for every engine, so the parts run one after the other (their estimates add). A ``{record: count}``
    mapping has no order: pass its parts separately (``instruction_stream.kernel_segments``)."""
    if isinstance(records, Mapping):
        return _estimate(records, target)
    records = list(records)
    cuts = [i + 1 for i, r in enumerate(records) if r.instruction == "register_load"]
    if cuts and cuts[0] < len(records):
        bounds = [0] + cuts + [len(records)]
        return total([_estimate(records[a:b], target) for a, b in zip(bounds, bounds[1:], strict=False) if b > a], target)
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
        elif rec.instruction == "core_barrier":
            busy[eng] += CORE_BARRIER_NS * count
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
