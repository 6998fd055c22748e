"""PyTorch's OpInfo database through ``torch.compile(backend="neuron")``, as Inductor's own OpInfo test does.

Every op of ``op_db`` is compiled strict as a one-op function on its first sample input (float32, or the
first of int64/bool for ops without float samples) and compared with eager. An op either matches eager or
is refused by name (``UnsupportedOpError``); a crash or a wrong result fails its test. Ops still refused are
listed in ``expected.py`` with the reason; a refused op missing from that table fails, and so does a
listed op that now passes (take it out of the table). ``python tests/opinfo/harness.py`` runs the same
classification over more samples and dtypes in parallel workers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from expected import EXPECTED_REFUSED, expected_refusal, out_of_scope  # noqa: E402
from harness import run_op  # noqa: E402

pytestmark = pytest.mark.slow


def _ops() -> list[tuple[str, str]]:
    from torch.testing._internal.common_methods_invocations import op_db

    return sorted({(o.name, o.variant_test_name) for o in op_db})


def _dtype_for(name: str, variant: str) -> str:
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == name and o.variant_test_name == variant)
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float32, torch.int64, torch.bool):
        if dtype in supported:
            return str(dtype).removeprefix("torch.")
    return "float32"


OPS = _ops()


@pytest.mark.parametrize("name, variant", OPS, ids=[f"{n}.{v}" if v else n for n, v in OPS])
def test_op_matches_eager_or_is_refused_by_name(name: str, variant: str) -> None:
    result = run_op((name, variant), samples=1, dtype_name=_dtype_for(name, variant))
    op, status, detail = result["op"], result["status"], result.get("detail")
    if status == "n/a":
        pytest.skip(f"{op}: OpInfo gives no sample eager accepts ({detail})")
    if out_of_scope(name):  # refused as a family; the few that lower must still match eager
        assert status in ("pass", "refused"), f"{op}: {status}: {detail}"
        return
    reason = expected_refusal(name, op)
    if reason is not None:
        assert status != "pass", f"{op} now matches eager: remove it from tests/opinfo/expected.py ({reason})"
        assert status == "refused", f"{op} (expected to be refused: {reason}) gave {status}: {detail}"
        return
    assert status == "pass", f"{op}: {status}: {detail}"


def test_expected_table_names_only_real_ops() -> None:
    names = {n for n, _ in OPS} | {f"{n}.{v}" for n, v in OPS if v}
    stale = sorted(set(EXPECTED_REFUSED) - names)
    assert not stale, f"tests/opinfo/expected.py lists ops OpInfo does not have: {stale}"
