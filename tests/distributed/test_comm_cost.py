"""The communication cost model (neuron_compile.comm_cost) and its place in ``explain``, in one process."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import neuron_compile
from neuron_compile.comm_cost import estimate_collective, simulate_overlap
from neuron_compile.costmodel import INTERCONNECT

log = logging.getLogger(__name__)
MB = 1 << 20


def test_all_gather_of_a_gpt2_block_over_one_trn2_instance() -> None:
    # 64 ranks (16 chips x 4 LNC=2 ranks), 14 MB of bf16 parameters gathered: RDH (log2 64 = 6 steps).
    full = 14 * MB
    est = estimate_collective("all_gather", 64, full // 64, full, "trn2")
    ic = INTERCONNECT["trn2"]
    assert est.algorithm == "rdh" and est.hops == 6 and est.fabric == "neuronlink"
    assert est.wire_bytes == 63 * (full // 64)
    assert est.link_gbps == ic.link_gbps_per_chip / 4 == 256.0
    assert est.latency_us == pytest.approx(6 * ic.hop_latency_us)
    assert est.transfer_us == pytest.approx(est.wire_bytes / 256e3)


@pytest.mark.parametrize(("nbytes", "algorithm", "hops"), [
    (256 * 1024, "mesh", 2 * 2), (8 * MB, "rdh", 2 * 6), (100 * MB, "ring", 2 * 63)])
def test_all_reduce_algorithm_follows_message_size(nbytes: int, algorithm: str, hops: int) -> None:
    est = estimate_collective("all_reduce", 64, nbytes, nbytes, "trn2")
    assert (est.algorithm, est.hops) == (algorithm, hops)  # all-reduce = reduce-scatter + all-gather: two phases
    assert est.wire_bytes == 2 * 63 * (nbytes // 64)


def test_fabric_depends_on_how_many_chips_the_group_spans() -> None:
    assert estimate_collective("all_reduce", 4, MB, MB).fabric == "on-chip"
    assert estimate_collective("all_reduce", 64, MB, MB).fabric == "neuronlink"
    efa = estimate_collective("all_reduce", 128, MB, MB)
    assert efa.fabric == "efa" and efa.latency_us == pytest.approx(efa.hops * INTERCONNECT["trn2"].efa_hop_latency_us)
    assert estimate_collective("all_reduce", 1, MB, MB).time_us == 0.0


def test_targets_without_published_interconnect_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="no documented interconnect figures for target 'trn1' \\(known: trn2\\)"):
        estimate_collective("all_reduce", 2, MB, MB, "trn1")
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        estimate_collective("gather", 2, MB, MB)


def test_overlap_replay() -> None:
    # issue a 10 us collective, 4 us of compute that does not need it, wait, 3 us that does; then a second
    # collective issued behind nothing, never waited for (the graph still returns only once it is done).
    o = simulate_overlap([("issue", "a", 10.0), ("compute", None, 4.0), ("wait", "a", 0.0), ("compute", None, 3.0),
                          ("issue", "b", 5.0)])
    assert o.compute_us == 7.0 and o.comm_us == 15.0
    assert o.total_us == 18.0  # 10 (a) + 3 + 5 (b)
    assert o.exposed_comm_us == 11.0 and o.hidden_fraction == pytest.approx(4 / 15)
    # collectives run one at a time on the collective engines
    o2 = simulate_overlap([("issue", "a", 10.0), ("issue", "b", 10.0), ("compute", None, 30.0), ("wait", "b", 0.0)])
    assert [c["start_us"] for c in o2.collectives] == [0.0, 10.0] and o2.exposed_comm_us == 0.0


def test_explain_reports_collectives_and_overlap(single_rank_group: None) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x @ w
        red = fc.all_reduce(h, "sum", dist.group.WORLD)
        return red + torch.tanh(x).sum()

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    report = neuron_compile.explain(f, x, w)
    assert len(report.collectives) == 1
    c = report.collectives[0]
    assert c["collectives"][0]["op"] == "all_reduce" and c["collectives"][0]["group_size"] == 1
    assert c["overlap"]["compute_us"] > 0 and c["segments_without_estimate"] == 0
    text = str(report)
    assert "graph with 1 collective(s)" in text and "all_reduce over 1 ranks" in text
    assert report.to_json()["collectives"][0]["target"] == "trn2"


def test_small_collective_on_one_chip_is_one_mesh_step_per_phase() -> None:
    est = estimate_collective("all_reduce", 2, 256, 256, "trn2")  # two ranks of one chip, 256 B
    assert (est.fabric, est.algorithm, est.hops) == ("on-chip", "mesh", 2)
    assert est.wire_bytes == 256 and "256 B sent per rank" in est.describe()
