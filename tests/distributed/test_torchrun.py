"""The three ways people train past one chip, under real ``torchrun --nproc_per_node=2`` (gloo on CPU).

One torchrun job runs every case of ``worker.py`` on two ranks (starting two Python processes that import
torch costs more than most cases, so they share one job); each test below checks one case's results on
both ranks. Every case runs the same code eagerly and with ``backend="neuron"`` on the same rank and
records losses, final parameters, graphs and segments. The job is killed, and the tests fail naming the
rank that hung, when a case takes longer than ``CASE_TIMEOUT`` seconds (or the job ``JOB_TIMEOUT``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
from launcher import HERE, Job, RankHangError, torchrun

log = logging.getLogger(__name__)

CASES = ["ddp", "fsdp2_blocks", "fsdp2_whole", "tp_mlp", "tp_attention", "collectives", "rank_agreement",
         "strict_refusal", "unsupported_group", "agreement_timeout"]  # agreement_timeout desyncs ranks: last
JOB_TIMEOUT = 300.0  # the whole job (about 60 s here)
CASE_TIMEOUT = 120.0  # no rank moved on to its next case for this long: a rank hung
ENV = {"NEURON_COMPILE_CACHE": "0"}  # every rank really lowers and renders its kernels


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    out = tmp_path_factory.mktemp("torchrun")
    result = torchrun(HERE / "worker.py", CASES, out, timeout=JOB_TIMEOUT, stall=CASE_TIMEOUT, env=ENV)
    assert result.returncode == 0, f"torchrun failed (exit {result.returncode}):\n{result.tail()}"
    assert all(r.get("cases") for r in result.ranks), f"a rank wrote no results:\n{result.tail()}"
    return result


def _case(job: Job, name: str) -> list[dict[str, Any]]:
    per_rank = [r["cases"][name] for r in job.ranks]
    for rank, res in enumerate(per_rank):
        assert "crashed" not in res, f"rank {rank} crashed in {name}:\n{res.get('traceback')}"
    return per_rank


def _assert_training(job: Job, name: str, *, rtol: float, param_atol: float, forward_graphs: int) -> None:
    for rank, res in enumerate(_case(job, name)):
        log.info("%s rank %d: %s", name, rank, {k: v for k, v in res.items() if k != "collective_graphs"})
        eager, neuron = res["eager_losses"], res["neuron_losses"]
        assert len(neuron) == 3 and all(math.isfinite(v) for v in neuron)
        for step, (a, b) in enumerate(zip(eager, neuron, strict=True)):
            assert b == pytest.approx(a, rel=rtol), f"{name} rank {rank} step {step}: eager {a} vs neuron {b}"
        assert neuron[-1] < neuron[0], f"{name} rank {rank}: the loss did not go down: {neuron}"
        assert res["max_param_diff"] <= param_atol, f"{name} rank {rank}: params differ by {res['max_param_diff']}"
        assert res["graphs"]["forward"] == forward_graphs and res["graphs"]["backward"] == forward_graphs, res["graphs"]


def test_ddp_compiled_module_matches_eager_ddp(job: Job) -> None:
    # DDP(torch.compile(model)): Dynamo's DDP optimizer splits the graph at the 1 MB bucket boundary.
    _assert_training(job, "ddp", rtol=1e-5, param_atol=1e-6, forward_graphs=2)


def test_fsdp2_bf16_each_block_compiled_matches_eager(job: Job) -> None:
    _assert_training(job, "fsdp2_blocks", rtol=2e-3, param_atol=1e-4, forward_graphs=2)
    a, b = (r["eager_losses"] for r in _case(job, "fsdp2_blocks"))
    assert a != b  # each rank trains on its own batch; the parameters agree because FSDP2 reduced the gradients


def test_fsdp2_bf16_whole_model_compiled_matches_eager(job: Job) -> None:
    # FSDP2's hooks are never traced by Dynamo (torch 2.13): the root's hooks split the model per block.
    _assert_training(job, "fsdp2_whole", rtol=2e-3, param_atol=1e-4, forward_graphs=2)


def _collectives_in(res: dict[str, Any], kind: str) -> list[str]:
    return [s for g in res["collective_graphs"] if g["kind"] == kind for s in g["steps"] if s.startswith("issue")]


def test_tensor_parallel_mlp_matches_eager(job: Job) -> None:
    _assert_training(job, "tp_mlp", rtol=1e-5, param_atol=1e-6, forward_graphs=1)
    for res in _case(job, "tp_mlp"):
        # RowwiseParallel's output all-reduce in the forward, ColwiseParallel's input-grad all-reduce backward.
        assert [s.split(":")[0] for s in _collectives_in(res, "forward")] == ["issue all_reduce"]
        assert len(_collectives_in(res, "backward")) == 1 and "all_reduce sum" in _collectives_in(res, "backward")[0]


def test_tensor_parallel_attention_matches_eager(job: Job) -> None:
    _assert_training(job, "tp_attention", rtol=1e-5, param_atol=1e-6, forward_graphs=1)
    for res in _case(job, "tp_attention"):
        assert len(_collectives_in(res, "forward")) == 1 and len(_collectives_in(res, "backward")) >= 1
        assert all(seg >= 2 for seg in res["segments"]), res["segments"]  # kernels on both sides of a collective


def test_collectives_in_one_compiled_region_match_eager(job: Job) -> None:
    for rank, res in enumerate(_case(job, "collectives")):
        assert max(res["max_diffs"]) < 1e-5 and max(res["max_diffs_second_call"]) < 1e-5, (rank, res["max_diffs"])
        steps = res["steps"]
        issued = [s.split(":", 1)[1].split(" of ")[0].strip() for s in steps if s.startswith("issue")]
        assert issued == ["all_reduce sum", "all_gather", "reduce_scatter sum", "all_to_all", "broadcast src=1",
                          "all_reduce avg"]
        # Issued early, waited for late: compute that does not need the all_reduce (tanh of x) runs while it is
        # in flight, and the first wait comes only after every collective was issued.
        first_issue = next(i for i, s in enumerate(steps) if s.startswith("issue"))
        first_wait = next(i for i, s in enumerate(steps) if s.startswith("wait"))
        assert any(s.startswith("compute") for s in steps[first_issue:first_wait])
        assert all(not s.startswith("issue") for s in steps[first_wait:])
        assert res["collective_graphs"][0]["collectives"] == 6
        assert res["segments"] == [res["collective_graphs"][0]["segments"]]
        # the cost model prices each (two ranks share a chip: on-chip transfers) and replays the overlap
        cost = res["comm_cost"]
        assert [c["op"] for c in cost["collectives"]] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                          "broadcast", "all_reduce"]
        assert all(c["fabric"] == "on-chip" and c["group_size"] == 2 for c in cost["collectives"])
        assert cost["overlap"]["compute_us"] > 0 and cost["segments_without_estimate"] == 0


def test_one_rank_failing_to_compile_fails_every_rank_with_its_error(job: Job) -> None:
    errors = [res["error"] for res in _case(job, "rank_agreement")]
    for rank, err in enumerate(errors):
        assert err is not None, f"rank {rank} compiled although rank 1 could not"
        assert err["chain"][:2] == ["BackendCompilerFailed", "DistributedCompileError"], err["chain"]
        assert "failed on rank 1 of 2: UnsupportedOpError" in err["message"]
        assert "aten._linalg_eigh.default(float32[2, 2]): its eigenvectors are read by the forward" in err["message"]
        assert "worker.py" in err["message"]  # the failing rank's source line
        assert "none waits forever on a collective" in err["message"]
        assert [f.split(":")[0] for f in err["failures"]] == ["rank 1"]
    assert errors[0]["message"] == errors[1]["message"]


def test_rank_that_never_compiles_is_named_after_the_timeout(job: Job) -> None:
    res = _case(job, "agreement_timeout")[0]
    err = res["error"]
    assert err is not None and err["type"] == "DistributedCompileError"
    assert "rank(s) 1 of 2 did not finish compiling it within 3 s (NEURON_COMPILE_RANK_AGREEMENT_TIMEOUT)" \
        in err["message"]
    assert "This rank's own compile succeeded" in err["message"]
    assert res["seconds"] < 30


def test_strict_mode_refuses_a_collective_it_cannot_lower_by_name(job: Job) -> None:
    for res in _case(job, "strict_refusal"):
        err = res["strict"]
        assert err is not None and err["type"] == "DistributedCompileError", err
        assert "failed on rank 0 of 2 (and on rank(s) 1): UnsupportedOpError" in err["message"]
        assert "_c10d_functional.all_reduce.default(int32[6], 'bor', '0'): reduction 'bor' cannot be lowered" \
            in err["message"]
        assert "options={'fallback': 'eager'}" in err["message"]
        assert res["fallback_equal"] is True  # the same graph with fallback='eager' runs the collective eagerly


def test_collective_on_unsupported_process_group_backend_is_refused(job: Job) -> None:
    for res in _case(job, "unsupported_group"):
        err = res["error"]
        assert err is not None and err["type"] == "DistributedCompileError", err
        assert f"process group '{res['group']}' uses backend 'fake', which compiled collectives cannot run on " \
               "(supported: gloo, neuron)" in err["message"]


def test_hung_rank_is_killed_and_named_within_the_time_limit(tmp_path: Path) -> None:
    import time

    start = time.perf_counter()
    with pytest.raises(RankHangError) as info:
        torchrun(HERE / "worker.py", ["hang"], tmp_path, timeout=120.0, stall=3.0, env=ENV)
    elapsed = time.perf_counter() - start
    msg = str(info.value)
    assert "made no progress for 3 s; killed" in msg
    assert "rank 1 hung in case 'hang'" in msg
    assert "rank 0 waiting for the other ranks after case 'hang'" in msg
    assert elapsed < 60
    for r in (0, 1):  # no rank outlives the job (torchrun starts each rank in its own session)
        pid = int((tmp_path / f"rank{r}.pid").read_text())
        assert not Path(f"/proc/{pid}").exists() or b"worker.py" not in Path(f"/proc/{pid}/cmdline").read_bytes()
