"""The scheduling cost model (neuron_compile.scheduler) on hand-written NKI kernels: documented latencies, resources,
loops, and monotonicity (splitting a store, adding an instruction or a dependency never lowers the estimate)."""

from __future__ import annotations

import logging

import pytest

from neuron_compile import costmodel as cm
from neuron_compile.instruction_stream import source_stream

log = logging.getLogger(__name__)

HEAD = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k(in0):
    out0 = nl.ndarray(({n},), dtype=nl.float32, buffer=nl.shared_hbm)
'''


def kernel(body: str, n: int) -> str:
    return HEAD.format(n=n) + "\n".join("    " + line for line in body.strip("\n").splitlines()) + "\n    return out0\n"


def est(src: str, n: int, **kw: object) -> float:
    return cm.estimate(source_stream(src, "k", [(n, "float32")], **kw)).time_ns  # type: ignore[arg-type]


def stream_kernel(tiles: int, free: int, split: int = 1, split_partitions: bool = False, extra: str = "",
                  dep: bool = False) -> tuple[str, int]:
    """Load a [128, free] fp32 tile, exp it on ScalarE, store it in ``split`` pieces; ``tiles`` times."""
    n = tiles * 128 * free
    pieces = (f"    for s in range(0, 128, {128 // split}):\n"
              f"        nisa.dma_copy(dst=out0.ap(pattern=[[{free}, {128 // split}], [1, {free}]], "
              f"offset=(t * 128 + s) * {free}), src=v[s:s + {128 // split}, :])") if split_partitions else (
              f"    for s in range(0, {free}, {free // split}):\n"
              f"        nisa.dma_copy(dst=out0.ap(pattern=[[{free}, 128], [1, {free // split}]], "
              f"offset=t * 128 * {free} + s), src=v[:, s:s + {free // split}])")
    body = f"""
for t in range({tiles}):
    v = nl.ndarray((128, {free}), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=in0.ap(pattern=[[{free}, 128], [1, {free}]], offset=t * 128 * {free}))
{extra}
    nisa.activation(dst=v, op=nl.exp, data={"w" if dep else "v"})
{pieces}
"""
    return kernel(body, n), n


@pytest.mark.parametrize("tiles,free", [(1, 2048), (8, 1024), (24, 4096)])
@pytest.mark.parametrize("partitions", [False, True])
def test_splitting_a_store_never_lowers_the_estimate(tiles: int, free: int, partitions: bool) -> None:
    times = []
    for split in (1, 2, 4, 8, 16, 32, 64, 128):
        if free % split or 128 % split:
            continue
        src, n = stream_kernel(tiles, free, split, partitions)
        times.append(est(src, n))
    assert all(b >= a * (1 - 1e-9) for a, b in zip(times, times[1:], strict=False)), times
    assert times[-1] > times[0]  # 128 stores per tile pay their issue cost


@pytest.mark.parametrize("tiles,free", [(1, 512), (6, 2048), (40, 1024)])
def test_adding_an_instruction_or_a_dependency_never_lowers_the_estimate(tiles: int, free: int) -> None:
    base_src, n = stream_kernel(tiles, free)
    base = est(base_src, n)
    scratch = f"    w = nl.ndarray((128, {free}), dtype=nl.float32, buffer=nl.sbuf)"
    for extra in (f"{scratch}\n    nisa.memset(dst=w, value=0.0, engine=nisa.engine.gpsimd)",  # independent
                  f"{scratch}\n    nisa.tensor_copy(dst=w, src=v)",  # on VectorE, reads the load
                  f"{scratch}\n    nisa.activation(dst=w, op=nl.copy, data=v)"):  # on ScalarE, before the exp
        src, _ = stream_kernel(tiles, free, extra=extra)
        assert est(src, n) >= base * (1 - 1e-9), extra
        # ... and the exp reading the extra instruction's output (a new dependency) costs at least as much again
        dep_src, _ = stream_kernel(tiles, free, extra=extra, dep=True)
        assert est(dep_src, n) >= est(src, n) * (1 - 1e-9), extra


def test_dependent_one_element_chain_runs_at_the_documented_interval() -> None:
    """NKI Performance Optimizations, Opt #5a: back-to-back dependent one-element ScalarE instructions start every
    ~266 ScalarE cycles on NC-v3 (222 ns); independent ones every 100 cycles (the fixed overhead)."""
    chain = kernel("""
v = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=v, value=0.0, engine=nisa.engine.scalar)
for i in range(1000):
    nisa.activation(dst=v, op=nl.exp, data=v)
""", 128)
    free = chain.replace("nisa.activation(dst=v, op=nl.exp, data=v)",
                         "w = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
                         "        nisa.activation(dst=w, op=nl.exp, data=v)")
    t_chain, t_free = est(chain, 128), est(free, 128)
    per = (t_chain - t_free) / 1000  # extra time per dependent instruction
    assert per == pytest.approx((cm.DEP_II_CYCLES[3] - cm.INSTRUCTION_OVERHEAD) / 1.2, rel=0.01)
    assert (t_chain - cm.KERNEL_LAUNCH_NS) / 1000 == pytest.approx(266 / 1.2, rel=0.01)


def test_one_engine_dma_takes_its_bytes_at_engine_bandwidth_after_the_start_latency() -> None:
    """NKI DMA overview, Example 1: A[4, 4096] bf16 HBM -> SBUF runs on one DMA engine, 32 KiB in ~1416 ns."""
    src = '''
import nki.isa as nisa
import nki.language as nl


def k(in0):
    t = nl.ndarray((4, 4096), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=in0.ap(pattern=[[4096, 4], [1, 4096]], offset=0))
'''
    stream = source_stream(src, "k", [(4 * 4096, "bfloat16")], timeline=True)
    (tl,) = [s.timeline for s in stream.schedules]
    ((queue, start, end, instr, line),) = tl
    assert queue == "dma_q0" and instr == "dma_copy" and line == 8
    assert start == 0  # triggered at once; the bytes move 1300 ns later at one engine's 23 B/ns
    assert end - start == pytest.approx(cm.DMA_START_LATENCY_NS + 32768 / 23, rel=1e-6)
    assert 32768 / 23 == pytest.approx(1416, rel=0.01)


def test_psum_has_eight_banks() -> None:
    """PSUM tiles rotate through 8 banks: with short matmuls and long evictions, eight matmuls run ahead and the ninth
    waits until the first tile's eviction is done."""
    src = kernel("""
a = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
b = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
nisa.memset(dst=a, value=1.0)
nisa.memset(dst=b, value=1.0)
outs = nl.ndarray((128, 16, 512), dtype=nl.float32, buffer=nl.sbuf)
for i in range(16):
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc[:, 0:64], stationary=a, moving=b)
    nisa.activation(dst=outs[:, i, :], op=nl.copy, data=acc)
""", 128)
    stream = source_stream(src, "k", [(128, "float32")], timeline=True)
    (tl,) = [s.timeline for s in stream.schedules]
    mms = [start for q, start, _, instr, _ in tl if instr == "nc_matmul"]
    evictions = [end for q, _, end, instr, _ in tl if instr == "activation"]
    assert all(m < evictions[0] for m in mms[:8])  # eight matmuls run ahead of the (slower) evictions ...
    assert mms[8] >= evictions[0]  # ... the ninth needs the first bank back
    assert mms[9] >= evictions[1]


def test_skipped_loops_match_full_scheduling() -> None:
    """A long loop nest: identical iterations skipped by their period give the same counts and time as scheduling
    every instruction."""
    src, n = stream_kernel(300, 512)
    fast = source_stream(src, "k", [(n, "float32")])
    full = source_stream(src, "k", [(n, "float32")], timeline=True)
    assert fast == full
    assert fast.schedules[0].skipped > 200 and fast.schedules[0].scheduled < 100
    assert cm.estimate(fast).time_ns == pytest.approx(cm.estimate(full).time_ns, rel=0.01)


def test_first_order_figure_rides_along() -> None:
    src, n = stream_kernel(8, 2048)
    stream = source_stream(src, "k", [(n, "float32")])
    e = cm.estimate(stream)
    assert e.scheduled_ns is not None and e.first_order_ns == pytest.approx(cm.first_order(stream).time_ns)
    assert e.time_ns == e.scheduled_ns
    with pytest.raises(ValueError, match="scheduled for trn2, not trn3"):
        cm.estimate(stream, "trn3")


def test_launch_grid_costs_each_core_its_share() -> None:
    """LNC=2: each program of the launch grid is scheduled on its own core (its rows, its core's HBM share); the
    kernel takes the slowest program, and the counts are both programs'."""
    n = 16 * 128 * 2048
    src = kernel("""
for t in range(0 + nl.program_id(0) * 1, 16, 1 * nl.num_programs(0)):
    v = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=in0.ap(pattern=[[2048, 128], [1, 2048]], offset=t * 128 * 2048))
    nisa.activation(dst=v, op=nl.exp, data=v)
    nisa.dma_copy(dst=out0.ap(pattern=[[2048, 128], [1, 2048]], offset=t * 128 * 2048), src=v)
""", n)
    one, two = (source_stream(src, "k", [(n, "float32")], target="trn2", grid=g) for g in (1, 2))
    assert len(one.schedules) == 1 and len(two.schedules) == 2
    assert two == one  # the same instructions, split between the cores
    t1, t2 = (cm.estimate(s, "trn2").time_ns - cm.KERNEL_LAUNCH_NS for s in (one, two))
    assert t2 == pytest.approx(t1 / 2, rel=0.1)
    assert t2 == pytest.approx(max(s.makespan_ns for s in two.schedules))


def _after_dead_tiles(dead: bool) -> tuple[str, int]:
    """Five 48 KiB tiles (one line each) fill SBUF past its 208 KiB, then (``dead``: their references dropped, as an
    earlier loop's tiles die) a loop loads, exps and stores an 8 KiB tile per iteration at one line."""
    n = 16 * 128 * 2048
    fill = "\n".join(f"f{i} = nl.ndarray((128, 12288), dtype=nl.float32, buffer=nl.sbuf)\n"
                     f"nisa.memset(dst=f{i}, value=0.0)" for i in range(5))
    drop = "\n".join(f"f{i} = None" for i in range(5)) if dead else ""
    return kernel(f"""
{fill}
{drop}
for t in range(16):
    v = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=v, src=in0.ap(pattern=[[2048, 128], [1, 2048]], offset=t * 128 * 2048))
    nisa.activation(dst=v, op=nl.exp, data=v)
    nisa.dma_copy(dst=out0.ap(pattern=[[2048, 128], [1, 2048]], offset=t * 128 * 2048), src=v)
""", n), n


def test_dead_lines_give_their_sbuf_to_later_lines() -> None:
    """SBUF that an earlier part of the kernel no longer uses goes back to the allocator: a loop after dead tiles
    rotates its tile among buffers (the next load runs while the exp works on the previous tile); with the earlier
    tiles still referenced, SBUF is full and every iteration waits for the previous one's store."""
    (dead, n), (alive, _) = _after_dead_tiles(True), _after_dead_tiles(False)
    tl_dead, tl_alive = ([s.timeline for s in source_stream(src, "k", [(n, "float32")], timeline=True).schedules][0]
                         for src in (dead, alive))

    line = next(i + 1 for i, text in enumerate(dead.splitlines()) if "nisa.dma_copy(dst=v," in text)

    def overlapped(tl: list) -> int:  # loads that start before the previous exp has ended
        loads = [a for q, a, b, i, ln in tl if i == "dma_copy" and ln == line]
        exps = [b for q, a, b, i, ln in tl if i == "activation"]
        return sum(ld < e for ld, e in zip(loads[1:], exps, strict=False))

    assert overlapped(tl_dead) >= 12 and overlapped(tl_alive) == 0
    assert est(dead, n) < 0.85 * est(alive, n)


def test_reused_sbuf_waits_for_the_dead_tiles_last_access() -> None:
    """A tile placed in the memory of dead tiles (SBUF full) is written only after their last access has ended: here
    the memset of `b` waits for the long load into the dropped `a`; with `a` still referenced nothing is reused (the
    model then runs over budget rather than guess) and the memset starts at once."""
    n = 128 * 25600

    def src(drop: bool) -> str:
        return kernel(f"""
a = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=a, src=in0.ap(pattern=[[25600, 128], [1, 25600]], offset=0))
{"a = None" if drop else ""}
c = nl.ndarray((128, 25600), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=c, value=0.0)
b = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=b, value=1.0)
""", n)

    def times(drop: bool) -> tuple[float, float, float]:
        (tl,) = [s.timeline for s in source_stream(src(drop), "k", [(n, "float32")], timeline=True).schedules]
        load_end = next(b for q, a, b, i, ln in tl if i == "dma_copy")
        (_, c_end), (b_start, _) = [(a, b) for q, a, b, i, ln in tl if i == "memset"]
        return load_end, c_end, b_start

    load_end, c_end, b_start = times(True)
    assert b_start >= load_end > 2 * c_end
    load_end, c_end, b_start = times(False)
    assert b_start == c_end < load_end
