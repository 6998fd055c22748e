"""Sequencer registers (nisa.register_alloc/move/load/store, VirtualRegister) and runtime loops on them."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import tile, val

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import load_kernel_source, nisa, nl, trace
from neuron_compile.simulator.tensor import from_array

sys.path.insert(0, str(Path(__file__).parent.parent))
from branch_kernel import BRANCH_SRC  # noqa: E402

log = logging.getLogger(__name__)

double_if_positive = load_kernel_source(BRANCH_SRC, "<branch>")["k"]  # 2 * a when max(a) > 0, else a


@pytest.mark.parametrize("positive", [True, False])
def test_while_loop_runs_iff_on_chip_flag_is_nonzero(positive: bool) -> None:
    a = np.arange(8, dtype=np.float32) - 3 if positive else -np.arange(8, dtype=np.float32) - 1
    with trace() as t:
        got = double_if_positive(a)
    np.testing.assert_array_equal(got, (np.where(a.max() > 0, 2 * a, a)).reshape(1, 8))
    body = ["tensor_scalar", "register_alloc"] if positive else []
    assert t.instructions() == ["dma_copy", "tensor_reduce", "tensor_scalar", "register_alloc", "register_load",
                                *body, "dma_copy"]
    seq = [r for r in t.records if r.engine == "sequencer"]
    assert [r.instruction for r in seq] == ["register_alloc", "register_load"] + (["register_alloc"] if positive else [])
    load = seq[1]
    assert (load.partitions, load.free_size, load.dtypes, load.bytes, load.buffers, load.shapes) == (
        1, 1, ("int32",), 4, ("sbuf",), ((1, 1),))


def run_while(flag_value: float, dtype: str) -> int:
    """Iterations of a while_loop whose flag is loaded from a (1, 1) ``dtype`` SBUF tile."""
    flag = nisa.register_alloc()
    nisa.register_load(dst=flag, src=tile(np.full((1, 1), flag_value, dtype=np.dtype(dtype))))
    runs = []

    def body(r):
        runs.append(r.value)
        return nisa.register_alloc(0)

    nl.while_loop(flag, body)
    return len(runs)


def test_float32_payload_nonzero_is_not_truncated() -> None:
    assert run_while(0.5, "float32") == 1  # 0.5 != 0.0 (int(0.5) would be 0)
    assert run_while(-0.25, "float32") == 1
    assert run_while(0.0, "float32") == 0
    assert run_while(7, "int32") == 1
    assert run_while(0, "uint8") == 0
    reg = nisa.register_alloc()
    nisa.register_load(dst=reg, src=tile(np.full((1, 1), 0.5, np.float32)))
    assert (reg.value, reg.dtype) == (0.5, "float32")


def test_while_loop_counts_down_through_registers() -> None:
    """The body gets the condition by value and returns the next register: a 3-iteration countdown."""
    counter = tile(np.full((1, 1), 3, np.int32))
    seen = []

    def body(r):
        seen.append(r.value)
        nisa.tensor_scalar(dst=counter, data=counter, op0=nl.subtract, operand0=1.0)
        nxt = nisa.register_alloc()
        nisa.register_load(dst=nxt, src=counter)
        return nxt

    first = nisa.register_alloc()
    nisa.register_load(dst=first, src=counter)
    nl.while_loop(first, body)
    assert seen == [3, 2, 1]
    assert val(counter).tolist() == [[0]]


def test_register_load_rejects_two_elements() -> None:
    two = tile(np.zeros((1, 2), np.int32))
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.register_load(dst=nisa.register_alloc(), src=two)
    assert str(e.value) == (f"nisa.register_load: operand 'src' = (1, 2) violates limit: exactly one element "
                            f"(shape [1] or [1, 1]) (tensor '{two.name}' in nl.sbuf)")


def test_register_load_buffers() -> None:
    """The real API loads from HBM or SBUF (nki.isa.register_load docstring); PSUM is refused."""
    reg = nisa.register_alloc()
    nisa.register_load(dst=reg, src=from_array(np.array([[5]], np.int32)))  # HBM
    assert reg.value == 5
    ps = tile(np.zeros((1, 1), np.float32), buffer=nl.psum)
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.register_load(dst=reg, src=ps)
    assert str(e.value) == (f"nisa.register_load: operand 'src' = 'nl.psum' violates limit: a register moves data "
                            f"to/from SBUF or HBM (tensor '{ps.name}' of shape (1, 1); copy PSUM to SBUF first)")


def test_register_load_payload_and_operand_errors() -> None:
    bf = tile(np.zeros((1, 1), np.float32), dtype=nl.bfloat16)
    with pytest.raises(SimulatorConstraintError, match=re.escape(
            "operand 'src' = 'bfloat16' violates limit: a 32-bit register payload: one of int8, int16, int32, "
            "uint8, uint16, uint32, float32")):
        nisa.register_load(dst=nisa.register_alloc(), src=bf)
    with pytest.raises(SimulatorError, match=re.escape(
            "nisa.register_load: dst must be a VirtualRegister from nisa.register_alloc(), got NkiTensor")):
        nisa.register_load(dst=bf, src=bf)
    with pytest.raises(SimulatorError, match=re.escape(
            "nisa.register_load: src must be an NkiTensor with exactly one element, got int")):
        nisa.register_load(dst=nisa.register_alloc(), src=3)
    with pytest.raises(SimulatorError, match="dst is a read-only register"):
        nisa.register_move(dst=nisa.VirtualRegister(1, frozen=True), src=2)


def test_register_alloc_and_move() -> None:
    assert nisa.register_alloc().value == 0
    assert nisa.register_alloc(None).value == 0
    assert nisa.register_alloc(-7).value == -7
    assert nisa.register_alloc(np.int32(9)).value == 9
    assert isinstance(nisa.register_alloc(), nisa.VirtualRegister)
    with pytest.raises(SimulatorError) as e:
        nisa.register_alloc(1.5)
    assert str(e.value) == "nisa.register_alloc: expected a compile-time int (or None), got float 1.5"
    with pytest.raises(SimulatorError, match=re.escape("immediate 4294967296 does not fit a 32-bit register")):
        nisa.register_alloc(2 ** 32)
    with pytest.raises(SimulatorError, match="got NkiTensor"):
        nisa.register_alloc(tile(np.zeros((1, 1), np.int32)))
    a, b = nisa.register_alloc(), nisa.register_alloc(4)
    nisa.register_move(dst=a, src=10)
    assert a.value == 10
    nisa.register_move(a, b)
    assert (a.value, b.value) == (4, 4)
    with pytest.raises(SimulatorError, match="nisa.register_move: expected a compile-time int"):
        nisa.register_move(dst=a, src="x")


def test_register_store_casts_to_dst_dtype() -> None:
    f = tile(np.zeros((1, 1), np.float32))
    nisa.register_store(dst=f, src=nisa.register_alloc(-3))
    assert val(f).tolist() == [[-3.0]]
    reg = nisa.register_alloc()
    nisa.register_load(dst=reg, src=tile(np.full((1, 1), 2.5, np.float32)))
    i = tile(np.zeros((1, 1), np.int32))
    nisa.register_store(i, reg)
    assert val(i).tolist() == [[2]]  # fp32 -> int: round half to even
    u8 = tile(np.zeros((1, 1), np.uint8))
    nisa.register_store(dst=u8, src=nisa.register_alloc(300))
    assert val(u8).tolist() == [[255]]  # saturates
    with pytest.raises(SimulatorConstraintError, match=re.escape("operand 'dst' = (2, 1) violates limit: exactly one")):
        nisa.register_store(dst=tile(np.zeros((2, 1), np.int32)), src=reg)
    with pytest.raises(SimulatorError, match="src must be a VirtualRegister"):
        nisa.register_store(dst=i, src=3)


def test_register_instructions_trace_on_the_sequencer() -> None:
    t1 = tile(np.full((1, 1), 6, np.int32))
    with trace() as t:
        r = nisa.register_alloc(1)
        nisa.register_move(dst=r, src=2)
        nisa.register_load(dst=r, src=t1)
        nisa.register_store(dst=t1, src=r)
    assert [(rec.engine, rec.instruction) for rec in t.records] == [
        ("sequencer", "register_alloc"), ("sequencer", "register_move"), ("sequencer", "register_load"),
        ("sequencer", "register_store")]
    assert [rec.dtypes for rec in t.records] == [(), (), ("int32",), ("int32",)]


def test_loop_argument_errors() -> None:
    with pytest.raises(SimulatorError, match=re.escape("nl.while_loop: init must be a VirtualRegister")):
        nl.while_loop(1, lambda r: r)
    with pytest.raises(SimulatorError, match=re.escape(
            "nl.while_loop: body_fun must return the next condition register (a VirtualRegister, e.g. "
            "nisa.register_alloc(0) to stop), got NoneType")):
        nl.while_loop(nisa.register_alloc(1), lambda r: None)
    calls: list[int] = []
    nl.fori_loop(nisa.register_alloc(1), nisa.register_alloc(4), lambda i: calls.append(i) and None)
    assert calls == [1, 2, 3]
    fr = nisa.register_alloc()
    nisa.register_load(dst=fr, src=tile(np.full((1, 1), 3.0, np.float32)))
    with pytest.raises(SimulatorError, match=re.escape(
            "nl.fori_loop: the register holds a float32 payload (3.0); loop bounds and offsets need an integer "
            "register")):
        nl.fori_loop(0, fr, lambda i: None)
    with pytest.warns(DeprecationWarning, match="nl.while_loop"):
        assert bool(nisa.register_alloc(2)) is True


def test_register_as_scalar_offset() -> None:
    data = tile(np.arange(16, dtype=np.float32).reshape(1, 16))
    idx = nisa.register_alloc()
    nisa.register_load(dst=idx, src=tile(np.full((1, 1), 5, np.int32)))
    out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=data.ap([[16, 1], [1, 4]], scalar_offset=idx, indirect_dim=1))
    log.debug("scalar offset view: %s", out)
    assert val(out).reshape(-1).tolist() == [5.0, 6.0, 7.0, 8.0]
