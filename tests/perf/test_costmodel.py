"""Cost model (neuron_compile.costmodel) against hand-computed cases from REFERENCE 4 (docs/cost_model.md)."""

from __future__ import annotations

import logging

import pytest

from neuron_compile import costmodel as cm
from neuron_compile.simulator.trace import InstructionRecord

log = logging.getLogger(__name__)


def mm(m: int, n: int, k: int = 128, dtype: str = "bfloat16", flags: tuple[str, ...] = ()) -> InstructionRecord:
    return InstructionRecord("tensor", "nc_matmul", m, n, ("float32", dtype, dtype), 0, ("psum", "sbuf", "sbuf"),
                             ((m, n), (k, m), (k, n)), ((n, 1), (m, 1), (n, 1)), flags)


def vec(instr: str, n: int, dtypes: tuple[str, ...], buffers: tuple[str, ...] | None = None, p: int = 128,
        engine: str = "vector", inner_stride: int = 1) -> InstructionRecord:
    buffers = buffers or ("sbuf",) * len(dtypes)
    return InstructionRecord(engine, instr, p, n, dtypes, 0, buffers, ((p, n),) * len(dtypes),
                             ((n, inner_stride),) * len(dtypes))


def dma(p: int, f: int, dtype: str = "float32", hbm_inner: int = 1, to_sbuf: bool = True) -> InstructionRecord:
    sb = ((p, f), (f, 1), "sbuf")
    hb = ((p, f), (f * hbm_inner, hbm_inner), "private_hbm")
    dst, src = (sb, hb) if to_sbuf else (hb, sb)
    return InstructionRecord("dma", "dma_copy", p, f, (dtype, dtype), 0, (dst[2], src[2]), (dst[0], src[0]),
                             (dst[1], src[1]))


TRN2 = cm.hardware("trn2")


@pytest.mark.parametrize("m,n,dtype,flags,target,cycles", [
    (128, 512, "bfloat16", (), "trn2", 512),  # one moving column per cycle
    (128, 32, "bfloat16", (), "trn2", 64),  # initiation interval floor MM_INIT_LATENCY
    (128, 512, "float32", (), "trn2", 2048),  # fp32 4x
    (128, 128, "float32", ("is_transpose",), "trn2", 256),  # v3 transpose mode: fp32 only 2x
    (128, 128, "float32", ("is_transpose",), "trn1", 512),  # no transpose mode on NC-v2
    (1024, 16, "bfloat16", (), "trn2", 256),  # LoadStationary M/4 dominates a tiny moving tile
    (128, 512, "float8_e4m3", ("double_row",), "trn2", 256),
])
def test_matmul_cycles(m: int, n: int, dtype: str, flags: tuple[str, ...], target: str, cycles: int) -> None:
    assert cm.matmul_cycles(cm.hardware(target), mm(m, n, dtype=dtype, flags=flags)) == cycles


def test_matmul_time_and_flops() -> None:
    est = cm.estimate([mm(128, 512)] * 4, "trn2")
    assert est.engine_ns["tensor"] == pytest.approx(4 * 512 / 2.4)
    assert est.executed_flops == 4 * 2 * 128 * 128 * 512
    assert cm.estimate([mm(128, 512)], "trn1").engine_ns["tensor"] == pytest.approx(512 / 2.8)


def test_tensor_engine_transpose_is_a_matmul_with_the_identity() -> None:
    rec = InstructionRecord("tensor", "nc_transpose", 64, 128, ("float32", "float32"), 0, ("psum", "sbuf"),
                            ((64, 128), (128, 64)), ((128, 1), (64, 1)))
    assert cm.matmul_cycles(TRN2, rec) == 128 * 2  # N = P = 128 columns of identity, fp32 transpose mode 2x


@pytest.mark.parametrize("rec,cycles", [
    (vec("tensor_tensor", 512, ("float32",) * 3), 100 + 512),  # two inputs: 2N, at 2 per cycle on NC-v3
    (vec("tensor_tensor", 512, ("bfloat16",) * 3), 100 + 512),  # perf mode 2x (SBUF, all bf16)
    (vec("tensor_tensor", 512, ("bfloat16",) * 3, ("sbuf", "psum", "sbuf")), 100 + 512),  # PSUM input: no mode
    (vec("tensor_scalar", 512, ("bfloat16",) * 2), 100 + 128),  # perf mode 4x
    (vec("tensor_copy", 512, ("bfloat16",) * 2, ("sbuf", "psum")), 100 + 256),  # one side PSUM: 2x
    (vec("tensor_copy", 512, ("float32", "bfloat16")), 100 + 256),  # mixed dtypes: no mode, 2 per cycle
    (vec("tensor_copy", 512, ("float32",) * 2, inner_stride=8), 100 + 384),  # stride 32 B > 16 B: 1.5x
    (vec("reciprocal", 4, ("float32",) * 2), 100 + 32),  # VectorE reciprocal 8 cycles/element
    (vec("activation", 512, ("float32",) * 2, engine="scalar"), 100 + 512),
    (vec("tensor_scalar", 100, ("float32",) * 2, engine="gpsimd"), 100 + 400),  # GpSimd rsqrt 4x
])
def test_engine_cycles(rec: InstructionRecord, cycles: float) -> None:
    assert cm.engine_cycles(TRN2, rec) == pytest.approx(cycles)


def test_engine_clocks() -> None:
    est = cm.estimate([vec("tensor_tensor", 512, ("float32",) * 3),
                       vec("activation", 512, ("float32",) * 2, engine="scalar")], "trn2")
    assert est.engine_ns["vector"] == pytest.approx(612 / 0.96)
    assert est.engine_ns["scalar"] == pytest.approx(612 / 1.2)


def test_dma_full_tile() -> None:
    c = cm.dma_cost(TRN2, dma(128, 1024))  # 4 KiB per partition: saturated, 16 engines
    assert c.engines == 16 and c.moved_bytes == 128 * 4096 and c.hbm_bytes == 128 * 4096
    assert c.ns == pytest.approx(1300 + 128 * 4096 / (23 * 16))


def test_dma_derating_and_engines() -> None:
    small = cm.dma_cost(TRN2, dma(4, 512))  # 2 KiB per partition, P=4 -> one engine
    assert small.engines == 1
    assert small.ns == pytest.approx(1300 + 4 * 2048 / (23 * 0.9))
    strided = cm.dma_cost(TRN2, dma(128, 64, hbm_inner=300))  # 4-byte runs on the HBM side
    eff = 4 / (4 + 2048 * (1 / 0.9 - 1))
    assert strided.ns == pytest.approx(1300 + 128 * 256 / (23 * 16 * eff))
    assert cm.dma_efficiency(256) == pytest.approx(256 / (256 + 2048 / 9))
    assert cm.dma_efficiency(8192) == 1.0


def test_dma_busy_time_shares_engines_and_hbm_limit() -> None:
    est = cm.estimate([dma(8, 1024)] * 16, "trn2")  # 16 one-engine transfers run side by side
    one = cm.dma_cost(TRN2, dma(8, 1024)).ns
    assert est.engine_ns["dma"] == pytest.approx(one)
    assert est.dma_transfers == 16 and est.hbm_bytes == 16 * 8 * 4096


def test_overlap_and_dependency_term() -> None:
    recs = [dma(128, 1024), vec("tensor_scalar", 1024, ("float32",) * 2), dma(128, 1024, to_sbuf=False)] * 4
    est = cm.estimate(recs, "trn2")
    assert est.store_tiles == 4
    busiest = max(est.engine_ns.values())
    assert est.bottleneck == "dma"
    assert est.time_ns == pytest.approx(busiest + (sum(est.engine_ns.values()) - busiest) / 4)
    both = cm.total([est, est])
    assert both.time_ns == pytest.approx(2 * est.time_ns)


def test_counts_mapping_equals_list() -> None:
    r = vec("tensor_tensor", 300, ("float32",) * 3)
    assert cm.estimate({r: 5}).time_ns == pytest.approx(cm.estimate([r] * 5).time_ns)


def test_unknown_target_and_dtype() -> None:
    with pytest.raises(ValueError, match="unknown target 'trn9'"):
        cm.estimate([], "trn9")
    with pytest.raises(KeyError, match="unknown dtype 'complex64'"):
        cm.itemsize("complex64")


def test_peaks_match_the_documented_numbers() -> None:
    assert TRN2.pe_flops_per_s("bfloat16") / 1e12 == pytest.approx(78.6, abs=0.1)  # REFERENCE 4.2: 79 TFLOPS
    assert TRN2.pe_flops_per_s("float32") / 1e12 == pytest.approx(19.7, abs=0.1)  # 20 TFLOPS
    assert TRN2.dma_aggregate_gbps == 368  # DMABW table
    assert TRN2.hbm_core_gbps_roofline == 368  # min(3000 / 8, 368)


def test_dma_transpose_moves_its_bytes_at_the_documented_share_of_a_copy() -> None:
    """A 4-D HW-DGE transpose [16, 4, 8, 128] bf16 HBM -> SBUF [128, 4, 8, 16] (the matmul's A loads): the source's
    256 B rows derate it like a copy with those runs, then at 90% of that from HBM (50% from SBUF)."""
    shapes = ((128, 4, 8, 16), (16, 4, 8, 128))
    strides = ((4096, 128, 16, 1), (4096, 128, 65536, 1))
    tr = InstructionRecord("dma", "dma_transpose", 128, 512, ("bfloat16", "bfloat16"), 0, ("sbuf", "private_hbm"),
                           shapes, strides)
    moved = 128 * 512 * 2
    copy_at_runs = moved / (TRN2.dma_engine_bytes_per_ns * 16 * cm.dma_efficiency(256))
    assert cm.dma_cost(TRN2, tr).ns == pytest.approx(cm.DMA_FIXED_NS + copy_at_runs / 0.9)
    contiguous_copy = cm.dma_cost(TRN2, dma(128, 512, "bfloat16"))
    assert cm.dma_cost(TRN2, tr).ns > contiguous_copy.ns
    on_chip = InstructionRecord("dma", "dma_transpose", 128, 512, ("bfloat16", "bfloat16"), 0, ("sbuf", "sbuf"),
                                shapes, strides)
    assert cm.dma_cost(TRN2, on_chip).ns == pytest.approx(cm.DMA_FIXED_NS + copy_at_runs / 0.5)
