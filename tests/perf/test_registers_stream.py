"""Runtime branches on sequencer registers: the analytic stream follows the all-flags-zero path and the
cost model charges REGISTER_LOAD_NS of dependency per register_load (docs/cost_model.md)."""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from neuron_compile import costmodel as cm
from neuron_compile.device import SimulatorDevice
from neuron_compile.instruction_stream import count_instructions, source_stream
from neuron_compile.simulator import load_kernel_source, trace
from neuron_compile.simulator.trace import InstructionRecord

sys.path.insert(0, str(Path(__file__).parent.parent))
from branch_kernel import BRANCH_SRC  # noqa: E402

log = logging.getLogger(__name__)



def on_device(x: np.ndarray) -> object:
    """``x`` as the runner passes kernel arguments (a device tensor in shared HBM), which the stream models; a
    NumPy argument would be an ``nl.hbm`` tensor of its own."""
    return SimulatorDevice().upload(x)


def simulated(x: np.ndarray) -> tuple[np.ndarray, Counter[InstructionRecord]]:
    kernel = load_kernel_source(BRANCH_SRC, "<branch>")["k"]
    with trace() as t:
        out = kernel(on_device(x))
    return out, Counter(t.records)


def test_stream_skips_the_branch_body() -> None:
    stream = source_stream(BRANCH_SRC, "k", [(8, "float32")])
    assert count_instructions(stream) == {
        ("dma", "dma_copy"): 2, ("vector", "tensor_reduce"): 1, ("vector", "tensor_scalar"): 1,
        ("sequencer", "register_alloc"): 1, ("sequencer", "register_load"): 1}
    (load,) = [r for r in stream if r.instruction == "register_load"]
    assert load == InstructionRecord("sequencer", "register_load", 1, 1, ("int32",), 4, ("sbuf",), ((1, 1),),
                                     ((1, 1),))
    # Record for record the simulator's trace of an input whose flag is 0 (body not taken) ...
    x = -np.arange(1, 9, dtype=np.float32)
    out, recs = simulated(x)
    np.testing.assert_array_equal(out, x.reshape(1, 8))
    assert recs == stream
    # ... while a flag of 1 runs the body in the simulator (the stream never takes it).
    x = np.arange(8, dtype=np.float32) - 3
    out, recs = simulated(x)
    np.testing.assert_array_equal(out, 2 * x.reshape(1, 8))
    assert count_instructions(recs) - count_instructions(stream) == {
        ("vector", "tensor_scalar"): 1, ("sequencer", "register_alloc"): 1}


def test_estimate_charges_register_load_as_dependency_only() -> None:
    stream = source_stream(BRANCH_SRC, "k", [(8, "float32")])
    without = Counter({r: c for r, c in stream.items() if r.engine != "sequencer"})
    est, base = cm.first_order(stream), cm.first_order(without)
    assert cm.REGISTER_LOAD_NS == 2000.0
    assert est.dependency_ns == base.dependency_ns + cm.REGISTER_LOAD_NS
    assert est.engine_ns == base.engine_ns  # nothing on VectorE (or any engine)
    assert est.instructions["vector"] == base.instructions["vector"] == 2
    assert est.instructions["sequencer"] == 2 and "sequencer" not in base.instructions
    assert est.time_ns == pytest.approx(base.time_ns + 2000.0, rel=0, abs=1e-9)


def test_scheduled_register_load_drains_every_queue() -> None:
    """The scheduler: the flag's load waits for the reduce and compare that produce it, then REGISTER_LOAD_NS; the
    store after the branch starts only then."""
    stream = source_stream(BRANCH_SRC, "k", [(8, "float32")], timeline=True)
    (tl,) = [s.timeline for s in stream.schedules]
    by = {instr: (start, end) for _, start, end, instr, _ in tl}
    load = by["register_load"]
    assert load[1] - load[0] == cm.REGISTER_LOAD_NS
    assert load[0] >= by["tensor_scalar"][1]
    dmas = [start for q, start, _, instr, _ in tl if instr == "dma_copy"]
    assert len(dmas) == 2 and dmas[-1] >= load[1]  # the store after the branch
    assert cm.estimate(stream).time_ns >= cm.first_order(stream).time_ns


def seq(instr: str, count: int = 1) -> dict[InstructionRecord, int]:
    operands = {"register_load": ((("int32",), 4, ("sbuf",), ((1, 1),), ((1, 1),))),
                "register_store": ((("int32",), 4, ("sbuf",), ((1, 1),), ((1, 1),)))}
    dt, nbytes, bufs, shapes, strides = operands.get(instr, ((), 0, (), (), ()))
    return {InstructionRecord("sequencer", instr, 1, 1, dt, nbytes, bufs, shapes, strides): count}


@pytest.mark.parametrize("instr,dependency", [
    ("register_load", 3 * 2000.0), ("register_alloc", 0.0), ("register_move", 0.0), ("register_store", 0.0)])
def test_sequencer_records_cost(instr: str, dependency: float) -> None:
    est = cm.first_order(seq(instr, 3))
    assert est.engine_ns == dict.fromkeys(cm.ENGINES, 0.0)
    assert est.dependency_ns == dependency and est.time_ns == dependency
    assert est.instructions == {**dict.fromkeys(cm.ENGINES, 0), "sequencer": 3}


def test_stream_follows_compile_time_registers() -> None:
    src = '''
import nki.isa as nisa
import nki.language as nl


def k(in0):
    t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)

    def once(r):
        nisa.memset(dst=t, value=0)
        return nisa.register_alloc(0)

    nl.while_loop(nisa.register_alloc(1), once)
    lo, hi = nisa.register_alloc(), nisa.register_alloc()
    nisa.register_move(dst=hi, src=3)
    nl.fori_loop(lo, hi, lambda i: nisa.iota(dst=t, pattern=[[1, 1]]))
    loaded = nisa.register_alloc(5)
    nisa.register_load(dst=loaded, src=t)
    nl.fori_loop(0, loaded, lambda i: nisa.memset(dst=t, value=1))  # a loaded bound is 0: no iteration
    nisa.register_store(dst=t, src=loaded)
'''
    assert count_instructions(source_stream(src, "k", [(1, "int32")])) == {
        ("vector", "memset"): 1, ("gpsimd", "iota"): 3, ("sequencer", "register_alloc"): 5,
        ("sequencer", "register_move"): 1, ("sequencer", "register_load"): 1, ("sequencer", "register_store"): 1}


def test_ordered_stream_splits_at_the_branch() -> None:
    """A trace (ordered) whose branch was taken: the work after ``register_load`` starts once every engine drained,
    so its estimate adds to the part before; the segments of the analytic stream are the same two parts."""
    from neuron_compile.instruction_stream import _run_source

    x = np.arange(8, dtype=np.float32) - 3  # flag 1: the body runs
    kernel = load_kernel_source(BRANCH_SRC, "<branch>")["k"]
    with trace() as t:
        kernel(on_device(x))
    cut = next(i for i, r in enumerate(t.records) if r.instruction == "register_load") + 1
    before, after = t.records[:cut], t.records[cut:]
    assert [r.instruction for r in after] == ["tensor_scalar", "register_alloc", "dma_copy"]
    est = cm.first_order(t.records)
    parts = cm.first_order(Counter(before)) + cm.first_order(Counter(after))
    assert est.time_ns == pytest.approx(parts.time_ns, rel=1e-12)
    segments = _run_source(BRANCH_SRC, "k", [(8, "float32")], loaded_flag=1).segments
    assert segments == [Counter(before), Counter(after)]
