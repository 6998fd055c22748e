"""Warm start: a fresh process rebuilds a whole Dynamo graph from the cache without AOTAutograd.

Each test runs a cold process and a warm process on the same cache root and compares them with
eager and with each other: training graphs (forward and backward, optimizer-free), input
mutations (in-place ops on user inputs, BatchNorm running statistics), outputs aliasing inputs,
duplicated/aliased inputs, inference under ``no_grad``; then a corrupt warm entry and a missing
child entry. ``aot_autograd`` counters prove the warm process did not trace.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from cache_helpers import run_py

_MODEL = r"""
import json, logging, sys, torch
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import neuron_compile.backend as B
from torch._dynamo.utils import counters

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 24)
        self.bn = torch.nn.BatchNorm1d(24)
        self.out = torch.nn.Linear(24, 8)
    def forward(self, x, state):
        h = torch.relu(self.bn(self.lin(x)))
        state.mul_(0.5).add_(h.mean(0).detach()[:8])   # mutates a user input
        y = self.out(h)
        return y, y.view(-1)[:4], state.view(2, 4)     # a view of an output, a view of a mutated input

def run(fn, model, x, state, train):
    model.train(train)
    with torch.set_grad_enabled(train):
        y, head, st = fn(x, state)
        loss = y.float().pow(2).mean() + head.sum()
        if train:
            loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), st.detach().clone(), grads, {k: v.clone() for k, v in model.state_dict().items()}

torch.manual_seed(0)
ref = Net()
model = Net()
model.load_state_dict(ref.state_dict())
x = torch.randn(6, 16)
compiled = torch.compile(model, backend="neuron", dynamic=False)
results = {}
for train in (True, False):
    s_ref, s_cmp = torch.zeros(8), torch.zeros(8)
    for m in (ref, model):
        m.zero_grad(set_to_none=True)
    a = run(ref, ref, x, s_ref, train)
    b = run(compiled, model, x, s_cmp, train)
    torch.testing.assert_close(b[0], a[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b[1], a[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_cmp, s_ref, rtol=1e-4, atol=1e-4)   # the input really was mutated
    for n in a[2]:
        torch.testing.assert_close(b[2][n], a[2][n], rtol=1e-3, atol=1e-4, msg=n)
    for k in a[3]:
        torch.testing.assert_close(b[3][k], a[3][k], rtol=1e-4, atol=1e-4, msg=k)  # BN running stats
    results["train" if train else "eval"] = float(b[0])
print(json.dumps({"loss": results, "aot_calls": counters["aot_autograd"]["total"],
                  "graphs": [[g["kind"], g["cache_hit"], bool(g.get("whole_graph"))] for g in B.compiled_graphs()]}))
"""


def _run(root: Path, code: str = _MODEL) -> dict[str, object]:
    # The AOTAutograd warm path itself: warm frames (on by default) would skip the backend altogether.
    proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(root), "NEURON_COMPILE_WARM_FRAMES": "0"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")] == [], proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cold_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """One cold run of the model (shared: each test copies the root it damages)."""
    root = tmp_path_factory.mktemp("warm") / "cache"
    return root, _run(root)


def _copy(cold_root: tuple[Path, dict[str, object]], tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    shutil.copytree(cold_root[0], root, symlinks=True)
    return root


def _warm_entries(root: Path) -> dict[str, Path]:
    out = {}
    for d in os.listdir(root / "entries"):
        kind = json.loads((root / "entries" / d / "manifest.json").read_text())["key_parts"]["kind"]
        if kind.startswith("dynamo-"):
            out[kind] = root / "entries" / d
    return out


def test_training_and_inference_warm_start_without_tracing(cold_root: tuple[Path, dict[str, object]],
                                                           tmp_path: Path) -> None:
    """Cold: AOTAutograd traces both graphs. Warm (fresh process): no AOTAutograd call at all, the
    same losses, gradients, mutated input, aliasing views and BatchNorm statistics as eager."""
    root = _copy(cold_root, tmp_path)
    cold = cold_root[1]
    assert cold["aot_calls"] == 2
    assert cold["graphs"] == [["forward", False, False], ["backward", False, False], ["inference", False, False]]
    assert set(_warm_entries(root)) == {"dynamo-train", "dynamo-inference"}  # no dynamo-frame: the knob is off
    warm = _run(root)
    assert warm["aot_calls"] == 0
    assert warm["graphs"] == [["forward", True, True], ["backward", True, True], ["inference", True, True]]
    assert warm["loss"] == cold["loss"]


_ALIASED = r"""
import json, torch
import neuron_compile.backend as B
from torch._dynamo.utils import counters
def f(a, b):
    a.add_(1.0)
    return a * b + 1
fc = torch.compile(f, backend="neuron", dynamic=False)
out = []
for same in (False, True):
    torch.manual_seed(0)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    args = (a, a) if same else (a, b)
    ea = tuple(t.clone() for t in args) if not same else (a.clone(),) * 2
    if same:
        ea = (ea[0], ea[0])
    expect = f(*ea)
    got = fc(*args)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(args[0], ea[0])
    out.append(float(got.sum()))
print(json.dumps({"sums": out, "aot_calls": counters["aot_autograd"]["total"],
                  "hits": [bool(g.get("whole_graph")) for g in B.compiled_graphs()]}))
"""


def test_aliased_inputs_are_part_of_the_key(tmp_path: Path) -> None:
    """f(a, a) and f(a, b) give AOTAutograd different wrappers (dedupe): each has its own warm entry."""
    root = tmp_path / "cache"
    cold = _run(root, _ALIASED)
    warm = _run(root, _ALIASED)
    assert warm["sums"] == cold["sums"] and warm["aot_calls"] == 0 and all(warm["hits"])


def test_corrupt_warm_state_is_quarantined(cold_root: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    """A warm entry whose pickled AOTAutograd state is damaged (manifest hashes recomputed, so it
    passes the integrity check): quarantined with one warning, traced again, right numbers."""
    root = _copy(cold_root, tmp_path)
    entry = _warm_entries(root)["dynamo-train"]
    blob = b"\x80\x05not a pickle"
    (entry / "aot_autograd.pkl").write_bytes(blob)
    man = json.loads((entry / "manifest.json").read_text())
    man["files"]["aot_autograd.pkl"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (entry / "manifest.json").write_text(json.dumps(man))
    proc = run_py(_MODEL, env={"NEURON_COMPILE_CACHE_DIR": str(root)}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warns = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
    assert len(warns) == 1 and f"entry {entry.name[:12]} is corrupt (its warm-start state can't be loaded" in warns[0]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["aot_calls"] == 1  # training traced again; inference still warm
    assert data["graphs"][:2] == [["forward", True, False], ["backward", True, False]]
    assert any(p.startswith(entry.name) for p in os.listdir(root / "quarantine"))
    assert (entry / "aot_autograd.pkl").read_bytes() != blob  # republished by the traced compile


def test_missing_child_entry_traces_again(cold_root: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    root = _copy(cold_root, tmp_path)
    children = json.loads((_warm_entries(root)["dynamo-train"] / "children.json").read_text())
    backward = next(c["digest"] for c in children if c["kind"] == "backward")
    shutil.rmtree(root / "entries" / backward)
    data = _run(root)
    assert data["aot_calls"] == 1
    assert data["graphs"][:2] == [["forward", True, False], ["backward", False, False]]


def test_warm_entry_pickle_holds_no_graph_module_or_kernels(cold_root: tuple[Path, dict[str, object]]) -> None:
    """The stored state is AOTAutograd's metadata and our digests: no pickled GraphModule (code),
    no kernel source."""
    root = cold_root[0]
    blob = (_warm_entries(root)["dynamo-train"] / "aot_autograd.pkl").read_bytes()
    assert b"reduce_graph_module" not in blob and b"nki" not in blob.lower()
    entry = pickle.loads(blob)
    assert entry.serialized_bw_module is None
    assert {entry.compiled_fw.result.kind, entry.compiled_bw.result.kind} == {"forward", "backward"}


def test_import_never_brings_warm_state(cold_root: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    """Warm state is a pickle: `cache import` (verified) leaves it out; the ATen entries come in."""
    from neuron_compile.cli import main

    root = cold_root[0]
    archive = tmp_path / "a.tgz"
    assert main(["cache", "export", str(archive), "--cache-dir", str(root)]) == 0
    other = tmp_path / "other"
    assert main(["cache", "import", str(archive), "--cache-dir", str(other)]) == 0
    kinds = sorted(json.loads((other / "entries" / d / "manifest.json").read_text())["key_parts"]["kind"]
                   for d in os.listdir(other / "entries"))
    assert kinds == ["backward", "forward", "inference"]


_CONSTANTS = r"""
import json, torch
import neuron_compile.backend as B
from torch._dynamo.utils import counters
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.lin(x) * torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])  # a real tensor constant
torch.manual_seed(0)
m = M()
x = torch.randn(4, 8)
f = torch.compile(m, backend="neuron", dynamic=False)
f(x).sum().backward()
grad = m.lin.weight.grad.clone()
m.zero_grad()
m(x).sum().backward()
torch.testing.assert_close(grad, m.lin.weight.grad)
print(json.dumps({"aot_calls": counters["aot_autograd"]["total"],
                  "hits": [bool(g.get("whole_graph")) for g in B.compiled_graphs()]}))
"""


def test_graph_constants_warm_start_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15: graphs with real tensor constants (every HF model) were never cached. Now they are,
    warm-start (the lifted constants travel with the warm entry) and recompile to the same bytes."""
    from neuron_compile.cli import main

    root = tmp_path / "cache"
    assert _run(root, _CONSTANTS) == {"aot_calls": 1, "hits": [False, False]}
    assert _run(root, _CONSTANTS) == {"aot_calls": 0, "hits": [True, True]}
    assert main(["cache", "verify", "--recompile", "--json", "--cache-dir", str(root)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bad"] == [] and report["ok"] == 3 and len(report["unverifiable"]) == 1  # the warm entry


# --------------------------------------------------------------------------------------------
# NEURON_COMPILE_WARM_FRAMES=1: torch's Dynamo package in our cache, no Dynamo capture on a warm start

_FRAMES_MODULE = r'''
import functools, json, os, torch
from torch._dynamo.utils import counters


def logged(fn):  # a decorated forward, like every Hugging Face model's
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 24)
        self.out = torch.nn.Linear(24, 8)

    @logged
    def forward(self, x):
        return {"y": self.out(torch.relu(self.lin(x)))}


def main():
    import neuron_compile.backend as B  # noqa: F401
    from neuron_compile import warm_frames
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    out = {}
    for rows in [int(r) for r in os.environ["ROWS"].split(",")]:
        x = torch.randn(rows, 16)
        model.zero_grad(set_to_none=True)
        loss = compiled(x)["y"].pow(2).mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        ref = model(x)["y"].pow(2).mean()
        ref.backward()
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-3, atol=1e-4)
        out[rows] = {"frames": counters["frames"]["total"], "aot": counters["aot_autograd"]["total"]}
    print(json.dumps({"runs": out, "loaded": len(warm_frames.loaded_graphs())}))
'''


def _frames_run(tmp_path: Path, root: Path, rows: str) -> tuple[dict[str, object], list[str]]:
    (tmp_path / "frames_model.py").write_text(_FRAMES_MODULE)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" \
           "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n" \
           "import frames_model; frames_model.main()\n"
    proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(root), "NEURON_COMPILE_WARM_FRAMES": "1", "ROWS": rows},
                  timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "is dropped with caching_precompile" not in proc.stderr  # torch's per-guard warnings: said once, at INFO
    warns = [ln for ln in proc.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    return json.loads(proc.stdout.strip().splitlines()[-1]), warns


def test_warm_frames_skip_dynamo_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cold: traced, compiled, the Dynamo package stored as a ``dynamo-frame`` entry. Warm (fresh
    process): a training step of a decorated forward with no Dynamo frame traced and no AOTAutograd
    call, loss and gradients equal to eager; a new shape fails the loaded guards and is traced and
    compiled correctly. A damaged package (hashes recomputed) is quarantined with one WARNING and
    the model compiles as usual."""
    root = tmp_path / "cache"
    cold, warns = _frames_run(tmp_path, root, "6")
    assert warns == [] and cold["runs"] == {"6": {"frames": 1, "aot": 1}} and cold["loaded"] == 0
    frame = _warm_entries(root)["dynamo-frame"]
    assert json.loads((frame / "manifest.json").read_text())["key_parts"]["function"]["qualname"] == "Net.forward"
    from neuron_compile.cli import main

    assert main(["cache", "show", frame.name[:12], "--cache-dir", str(root)]) == 0
    assert "function:     Net.forward (frames_model.py:" in capsys.readouterr().out

    warm, warns = _frames_run(tmp_path, root, "6,3")
    assert warns == [] and warm["loaded"] == 1
    assert warm["runs"]["6"] == {"frames": 0, "aot": 0}  # Dynamo did not trace, AOTAutograd did not run
    assert warm["runs"]["3"] == {"frames": 1, "aot": 1}  # a guard failed: traced and compiled, right numbers

    blob = b"\x80\x05not a pickle"
    (frame / "dynamo_frame.pkl").write_bytes(blob)
    man = json.loads((frame / "manifest.json").read_text())
    man["files"]["dynamo_frame.pkl"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (frame / "manifest.json").write_text(json.dumps(man))
    damaged, warns = _frames_run(tmp_path, root, "6")
    assert len(warns) == 1 and f"entry {frame.name[:12]} is corrupt (its Dynamo package can't be loaded" in warns[0]
    assert damaged["loaded"] == 0 and damaged["runs"]["6"]["frames"] == 1
    assert any(p.startswith(frame.name) for p in os.listdir(root / "quarantine"))


def test_wrapped_function_reference_round_trips() -> None:
    """A decorated method's inner function (what torch's guard pickler can't name) is pickled as
    its qualified name plus ``__wrapped__`` steps, and resolves to the same object."""
    from neuron_compile import warm_frames


    ref = warm_frames._wrapped_ref(_decorated.__wrapped__)
    assert ref == (__name__, "_decorated", 1)
    assert warm_frames._wrapped_function(*ref) is _decorated.__wrapped__
    assert warm_frames._wrapped_ref(_decorated) is None  # reachable by name: torch pickles it itself


def _deco(fn):  # type: ignore[no-untyped-def]
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **k):  # type: ignore[no-untyped-def]
        return fn(*a, **k)

    return wrapper


@_deco
def _decorated(x: int) -> int:
    return x


_COMPLEX = r"""
import json, torch
import neuron_compile.backend as B
from torch._dynamo.utils import counters
freqs = torch.outer(torch.arange(8).float(), torch.linspace(0.1, 1.0, 4))
fc = torch.polar(torch.ones_like(freqs), freqs)          # a complex graph input
def f(x, fc):
    c = torch.view_as_complex(x.reshape(2, 8, 4, 2))
    y = c * fc.view(1, 8, 4)
    return torch.view_as_real(y).flatten(2), y             # a real and a complex output
compiled = torch.compile(f, backend="neuron", dynamic=False)
torch.manual_seed(0)
out = {}
for train in (True, False):
    x0 = torch.randn(2, 8, 8)
    xe, xc = x0.clone().requires_grad_(train), x0.clone().requires_grad_(train)
    with torch.set_grad_enabled(train):
        (ye, ce), (yc, cc) = f(xe, fc), compiled(xc, fc)
        torch.testing.assert_close(yc, ye)
        torch.testing.assert_close(cc, ce)
        if train:
            (ye * ye).sum().backward()
            (yc * yc).sum().backward()
            torch.testing.assert_close(xc.grad, xe.grad)
    out["train" if train else "eval"] = float(yc.sum())
print(json.dumps({"sums": out, "aot_calls": counters["aot_autograd"]["total"],
                  "graphs": [[g["kind"], g["cache_hit"], bool(g.get("whole_graph"))] for g in B.compiled_graphs()]}))
"""


def test_complex_graphs_warm_start_with_their_complex_inputs_and_outputs(tmp_path: Path) -> None:
    """A graph compiled as real pairs (complex input, complex output, its backward) rebuilt warm takes and gives
    complex tensors as the cold one does."""
    root = tmp_path / "cache"
    cold = _run(root, _COMPLEX)
    assert cold["aot_calls"] == 2
    warm = _run(root, _COMPLEX)
    assert warm["aot_calls"] == 0
    assert warm["graphs"] == [["forward", True, True], ["backward", True, True], ["inference", True, True]]
    assert warm["sums"] == cold["sums"]


_RANGE = r"""
import json, torch
from torch._dynamo.utils import counters
from neuron_compile.errors import InputRangeError
def f(a, big):
    return a.sin() * 2, big * 0.5
compiled = torch.compile(f, backend="neuron", dynamic=False)
a = torch.randn(3, requires_grad=True)
ok = compiled(a, torch.tensor([1.0, 2.0], dtype=torch.float64))
try:
    compiled(a, torch.tensor([1e300, 1.0], dtype=torch.float64))
    message = None
except InputRangeError as exc:
    message = str(exc)
print(json.dumps({"message": message, "aot_calls": counters["aot_autograd"]["total"]}))
"""


def test_input_range_errors_name_the_input_cold_and_warm(tmp_path: Path) -> None:
    """A float64 input past float32's range is refused naming it as the user's code does (L['big']), whether the
    graph was traced or rebuilt from the warm-start entry."""
    root = tmp_path / "cache"
    cold, warm = _run(root, _RANGE), _run(root, _RANGE)
    assert cold["aot_calls"] == 1 and warm["aot_calls"] == 0
    for run in (cold, warm):
        assert str(run["message"]).startswith("the float64[2] input L['big'] of the compiled graph (its input 1) holds "
                                              "finite values beyond float32's range")


_HASH = r"""
import json, torch
import neuron_compile.backend as B
from torch._dynamo.utils import counters
def f(x, y):
    return torch.hash_tensor(x, dim=1), torch.hash_tensor(y * 3), x.sum()  # uint64 outputs beside a float one
compiled = torch.compile(f, backend="neuron", dynamic=False)
x, y = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), torch.arange(-6, 6, dtype=torch.int32)
got, want = compiled(x, y), f(x, y)
assert [g.dtype for g in got] == [torch.uint64, torch.uint64, torch.float32]
assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
bits = torch.cat([got[1].view(torch.int64).reshape(1), got[0].view(torch.int64)])  # int() of a uint64 may overflow
print(json.dumps({"hashes": bits.tolist(), "aot_calls": counters["aot_autograd"]["total"],
                  "graphs": [[g["kind"], g["cache_hit"]] for g in B.compiled_graphs()]}))
"""


def test_hash_graphs_warm_start_with_their_uint64_outputs(tmp_path: Path) -> None:
    """A graph whose hash_tensor results come back as int32 word pairs rebuilt warm still returns uint64."""
    root = tmp_path / "cache"
    cold = _run(root, _HASH)
    warm = _run(root, _HASH)
    assert cold["aot_calls"] == 1 and warm["aot_calls"] == 0
    assert warm["graphs"] == [["inference", True]]
    assert warm["hashes"] == cold["hashes"]
