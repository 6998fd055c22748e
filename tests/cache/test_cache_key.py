"""Cache key sensitivity (every part that changes generated code changes the key) and stability
(nothing environmental does: cache path, HOME, hostname, process, input values)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.fx
from cache_helpers import run_py
from neuron_compile.cache import key as key_mod
from neuron_compile.cache.key import CacheKey, canonical_graph, compute_key, digest_of, input_signature
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compile
from neuron_compile.config import config


def _f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y * 2).sum(0)


def _key(fn=_f, inputs=None, **kw) -> CacheKey:  # type: ignore[no-untyped-def]
    inputs = inputs if inputs is not None else [torch.randn(2, 3), torch.randn(2, 3)]
    gm = make_fx(fn)(*inputs)
    return compute_key(gm, inputs, kind=kw.pop("kind", "forward"), **kw)


def test_digest_is_sha256_of_canonical_parts() -> None:
    k = _key()
    assert len(k.digest) == 64 and int(k.digest, 16) >= 0
    assert k.digest == digest_of(k.parts)
    assert json.loads(json.dumps(k.parts)) == k.parts  # JSON-able as is
    assert k.parts["schema"] == key_mod.SCHEMA_VERSION
    assert k.parts["neuron_compile"]["version"] == neuron_compile.__version__  # type: ignore[index]
    assert k.parts["torch"] == str(torch.__version__)
    assert k.parts["target"] == config.target
    assert k.parts["graph"]["ops"] == {"aten.add.Tensor": 1, "aten.mul.Tensor": 1,  # type: ignore[index]
                                       "aten.relu.default": 1, "aten.sum.dim_IntList": 1}


def test_canonical_graph_text() -> None:
    gm = make_fx(_f)(torch.randn(2, 3), torch.randn(2, 3))
    text = canonical_graph(gm)
    lines = text.splitlines()
    assert [ln.split(" = ")[0] for ln in lines] == ["arg0", "arg1", "n0", "n1", "n2", "n3", "n4"]
    assert '"target":"aten.mul.Tensor"' in lines[2] and '"args":{"tuple":["%arg1",2]}' in lines[2]
    assert '"val":{"dtype":"float32","shape":[3],"stride":[1]}' in lines[5]
    assert "0x" not in text and "x_1" not in text  # no addresses, no user names


@pytest.mark.parametrize("change", [
    "shape", "dtype", "stride", "requires_grad", "graph_edit", "op_edit", "constant_value", "kind", "extra",
])
def test_key_changes_with(change: str) -> None:
    base = _key(lambda x: x * 2 + torch.tensor([1.0, 2.0, 3.0]), [torch.randn(2, 3)])
    x = torch.randn(2, 3)
    fn = lambda x: x * 2 + torch.tensor([1.0, 2.0, 3.0])  # noqa: E731
    kw: dict[str, object] = {}
    if change == "shape":
        x = torch.randn(4, 3)
    elif change == "dtype":
        x = torch.randn(2, 3, dtype=torch.float16)
    elif change == "stride":
        x = torch.randn(3, 2).t()
        assert x.shape == (2, 3) and x.stride() == (1, 2)
    elif change == "requires_grad":
        x = torch.randn(2, 3, requires_grad=True)
    elif change == "graph_edit":
        fn = lambda x: x * 3 + torch.tensor([1.0, 2.0, 3.0])  # noqa: E731
    elif change == "op_edit":
        fn = lambda x: x / 2 + torch.tensor([1.0, 2.0, 3.0])  # noqa: E731
    elif change == "constant_value":
        fn = lambda x: x * 2 + torch.tensor([1.0, 2.0, 4.0])  # noqa: E731
    elif change == "kind":
        kw["kind"] = "backward"
    elif change == "extra":
        kw["extra"] = {"partition": 1}
    other = _key(fn, [x], **kw)
    assert other.digest != base.digest
    changed = {p for p in key_mod.flatten_parts(base.parts) if key_mod.flatten_parts(base.parts)[p] !=
               key_mod.flatten_parts(other.parts).get(p)}
    expected = {"shape": "inputs[0].shape", "dtype": "inputs[0].dtype", "stride": "inputs[0].stride",
                "requires_grad": "inputs[0].requires_grad", "graph_edit": "graph.sha256", "op_edit": "graph.ops",
                "constant_value": "graph.sha256", "kind": "kind", "extra": "extra"}[change]
    assert expected in changed, changed
    if change == "constant_value":
        assert changed == {"graph.sha256"}  # same ops, same shapes: only the constant's value hash moved


@pytest.mark.parametrize("knob,value", [("fuse", False), ("free_tile", 1024), ("lnc", 1),
                                        ("target", "trn1"), ("target", "trn3")])
def test_key_changes_with_codegen_knobs_and_target(knob: str, value: object) -> None:
    base = _key()
    with config.patch(**{knob: value}):
        other = _key()
    assert other.digest != base.digest
    assert other.parts["codegen"][knob] == value  # type: ignore[index]
    if knob == "target":
        assert other.parts["target"] == value


@pytest.mark.parametrize("dist", ["torch", "nki", "neuronx-cc"])
def test_key_changes_with_versions(dist: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _key()
    assert base.parts["nki"] is None and base.parts["neuronx_cc"] is None  # not installed here
    if dist == "torch":
        monkeypatch.setattr(key_mod, "_torch_version", lambda: "2.14.0")
    else:
        real = key_mod._dist_version
        monkeypatch.setattr(key_mod, "_dist_version", lambda name: "0.6.0" if name == dist else real(name))
    other = _key()
    assert other.digest != base.digest
    assert other.parts[dist.replace("-", "_")] in ("2.14.0", "0.6.0")


def test_dist_version_reads_metadata_without_importing() -> None:
    assert key_mod._dist_version("torch").startswith(torch.__version__.split("+")[0])  # type: ignore[union-attr]
    assert key_mod._dist_version("surely-not-installed-neuron-dist") is None
    _key()
    assert "nki" not in sys.modules and "neuronxcc" not in sys.modules


def test_template_edit_changes_source_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Test hook: point the fingerprint at a copy of the package tree with one template we edit.
    roots = []
    for label, folder, pattern in key_mod.fingerprint_roots():
        copy = tmp_path / label.replace(":", "_")
        if folder.is_dir():
            shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.mkdir(parents=True)
        roots.append((label, copy, pattern))
    labels = [r[0] for r in roots]
    assert "neuron_compile.codegen:templates" in labels and "neuron_compile.cache" in labels
    template = next(r[1] for r in roots if r[0].endswith(":templates")) / "elementwise.nki.j2"
    template.write_text("{{ x }} + 1\n")
    monkeypatch.setattr(key_mod, "fingerprint_roots", lambda: roots)
    key_mod.reset_source_fingerprint()
    try:
        k1 = _key()
        template.write_text("{{ x }} + 2\n")
        key_mod.reset_source_fingerprint()
        k2 = _key()
        (roots[0][1] / "backend_new_module.py").write_text("X = 1\n")  # a .py edit counts too
        key_mod.reset_source_fingerprint()
        k3 = _key()
        (roots[0][1] / "notes.txt").write_text("not code\n")  # other files don't
        key_mod.reset_source_fingerprint()
        k4 = _key()
    finally:
        key_mod.reset_source_fingerprint()
    fp = [k.parts["neuron_compile"]["source_sha256"] for k in (k1, k2, k3, k4)]  # type: ignore[index]
    assert len({k1.digest, k2.digest, k3.digest}) == 3 and fp[0] != fp[1] != fp[2]
    assert k4.digest == k3.digest


def test_source_fingerprint_memoized_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = key_mod.fingerprint_roots
    monkeypatch.setattr(key_mod, "fingerprint_roots", lambda: calls.append(1) or real())
    key_mod.reset_source_fingerprint()
    try:
        _key()
        _key()
    finally:
        key_mod.reset_source_fingerprint()
    assert calls == [1]


def test_stable_across_names_and_input_values() -> None:
    # Same computation traced from two functions with different variable names and input values.
    def f1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a + b * 2).sum(0)

    def f2(xx: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
        return torch.relu(xx + yy * 2).sum(0)

    k1 = _key(f1, [torch.zeros(2, 3), torch.ones(2, 3)])
    k2 = _key(f2, [torch.full((2, 3), 7.0), torch.randn(2, 3)])
    assert k1.digest == k2.digest
    # Parameters arriving as graph inputs (AOTAutograd lifts them): their values are not in the key.
    lin = torch.nn.Linear(3, 2)
    w1, w2 = lin.weight.detach().clone().requires_grad_(), torch.randn(2, 3, requires_grad=True)
    g = lambda w, x: torch.nn.functional.linear(x, w)  # noqa: E731
    assert _key(g, [w1, torch.randn(4, 3)]).digest == _key(g, [w2, torch.randn(4, 3)]).digest


def test_symbolic_trace_module_constants_hashed_by_value() -> None:
    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    m2 = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    m2.load_state_dict(m1.state_dict())
    t1, t2 = canonical_graph(torch.fx.symbolic_trace(m1)), canonical_graph(torch.fx.symbolic_trace(m2))
    assert t1 == t2 and "torch.nn.modules.linear.Linear" in t1
    with torch.no_grad():
        m2[0].bias.add_(1.0)
    assert canonical_graph(torch.fx.symbolic_trace(m2)) != t1


def test_input_signature() -> None:
    sig = input_signature([torch.randn(3, 2).t(), torch.ones(2, dtype=torch.int64, requires_grad=False), 4, 0.5,
                           None])
    assert sig[0] == {"kind": "tensor", "shape": [2, 3], "dtype": "float32", "stride": [1, 2],
                      "requires_grad": False, "device": "cpu"}
    assert sig[1]["dtype"] == "int64"
    assert sig[2:] == [{"kind": "int", "value": 4}, {"kind": "float", "value": 0.5}, {"kind": "NoneType", "value": None}]


def test_bad_kind_and_extra_rejected() -> None:
    with pytest.raises(ValueError, match="kind='training'.*forward, backward, inference"):
        _key(kind="training")
    with pytest.raises(TypeError, match=r"cache key part extra.obj=.*not JSON-able"):
        _key(extra={"obj": object()})


def test_key_has_no_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "somewhere"))
    k = _key()
    text = json.dumps(k.parts) + k.graph_text
    for needle in (str(tmp_path), os.path.expanduser("~"), socket.gethostname(), "somewhere"):
        assert needle not in text


_KEY_SCRIPT = """
import json, os, sys, torch
from torch.fx.experimental.proxy_tensor import make_fx
from neuron_compile.cache.key import compute_key
torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else os.getpid())
def f(x, w):
    return torch.relu(x @ w + torch.tensor([0.5, -1.0]))
x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
k = compute_key(make_fx(f)(x, w), [x, w], kind="forward")
print(json.dumps({"digest": k.digest, "pid": os.getpid(), "fingerprint": k.parts["neuron_compile"]["source_sha256"]}))
"""


def _keys_from_two_processes(tmp_path: Path, attempt: int) -> list[dict[str, object]]:
    outs = []
    for i in range(2):
        home = tmp_path / f"try{attempt}" / f"home{i}"
        home.mkdir(parents=True)
        env = {"HOME": str(home), "NEURON_COMPILE_CACHE_DIR": str(tmp_path / f"cache{i}"),
               "XDG_CACHE_HOME": str(home / ".cache"), "HOSTNAME": f"host{i}"}
        proc = run_py(_KEY_SCRIPT, env=env, cwd=home)
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return outs


def test_stable_across_processes_cache_paths_and_homes(tmp_path: Path) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    gm = make_fx(lambda x, w: torch.relu(x @ w + torch.tensor([0.5, -1.0])))(x, w)
    # Other engineers edit the package's sources while tests run, which (rightly) changes the
    # source fingerprint between processes; retry until one attempt sees a quiet tree.
    for attempt in range(3):
        outs = _keys_from_two_processes(tmp_path, attempt)
        key_mod.reset_source_fingerprint()
        here = compute_key(gm, [x, w], kind="forward")
        fingerprints = {o["fingerprint"] for o in outs} | {here.parts["neuron_compile"]["source_sha256"]}  # type: ignore[index]
        if len(fingerprints) == 1:
            break
    else:
        pytest.fail("package sources kept changing during the test: no stable fingerprint in 3 attempts")
    assert outs[0]["pid"] != outs[1]["pid"]
    assert outs[0]["digest"] == outs[1]["digest"] == here.digest


def _aot_keys(model: torch.nn.Module, batches: list[int], dynamic: bool | None) -> list[tuple[str, CacheKey]]:
    from torch._dynamo.backends.common import aot_autograd

    keys: list[tuple[str, CacheKey]] = []

    def compiler(kind: str):  # type: ignore[no-untyped-def]
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[object]):  # type: ignore[no-untyped-def]
            keys.append((kind, compute_key(gm, example_inputs, kind=kind)))
            return gm.forward

        return compile_graph

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=compiler("forward"),
                                                         bw_compiler=compiler("backward")), dynamic=dynamic)
    for b in batches:
        compiled(torch.randn(b, 4)).sum().backward()
    torch._dynamo.reset()
    return keys


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_real_aot_graphs_parameter_values_and_symbolic_sizes() -> None:
    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    a = _aot_keys(model(), [3], dynamic=False)
    b = _aot_keys(model(), [3], dynamic=False)  # fresh random weights: lifted inputs, not in the key
    assert [k for k, _ in a] == ["forward", "backward"]
    assert [k.digest for _, k in a] == [k.digest for _, k in b]
    assert a[0][1].digest != a[1][1].digest
    # A symbolic-size graph is keyed by its symbols, not by the batch a given call happened to see.
    d1 = _aot_keys(model(), [5], dynamic=True)
    d2 = _aot_keys(model(), [9], dynamic=True)
    assert [k.digest for _, k in d1] == [k.digest for _, k in d2]
    sym = [s for s in d1[0][1].parts["inputs"] if s["kind"] == "sym"]  # type: ignore[union-attr,index]
    assert len(sym) == 1 and sym[0]["expr"].startswith("s")
    assert d1[0][1].digest != a[0][1].digest


def test_real_tensor_constants_hash_inside_fake_mode() -> None:
    """Issue 15: graphs with real tensor constants (``x * torch.tensor(2.0)``, every HF model) failed with
    "Please convert all Tensors to FakeTensors first" because backend compilers run in a FakeTensorMode."""
    from neuron_compile.cache.graph_codec import decode_graph, encode_graph
    from torch._subclasses.fake_tensor import FakeTensorMode

    def build(c: float) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        x = g.placeholder("x")
        k = g.get_attr("_tensor_constant0")
        g.output(g.call_function(torch.ops.aten.mul.Tensor, (x, k)))
        root = torch.nn.Module()
        root.register_buffer("_tensor_constant0", torch.tensor(c))
        return torch.fx.GraphModule(root, g)

    x = torch.randn(3)
    two, three = build(2.0), build(3.0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        a = compute_key(two, [x], kind="inference")
        b = compute_key(three, [x], kind="inference")
        blob = encode_graph(two, [x])
    assert a.digest != b.digest  # the constant's value is in the key
    gm, inputs = decode_graph(blob)
    assert compute_key(gm, [x], kind="inference").digest == a.digest
    assert gm._tensor_constant0.item() == 2.0


def test_stored_graph_keeps_each_ops_source_location() -> None:
    """Check messages in plan.json name the user's line; an entry rebuilt from its stored graph (``cache import``
    verifies by recompiling) must name the same one, or every entry with such a check is refused as tampered."""
    from neuron_compile.cache.graph_codec import decode_graph, encode_graph

    from neuron_compile.errors import source_line

    gm = make_fx(lambda x: (x + 1) * 2)(torch.ones(3, dtype=torch.int64))
    add, mul = [n for n in gm.graph.nodes if n.op == "call_function"]
    add.meta["stack_trace"] = '  File "/home/user/train.py", line 7, in forward\n    y = x + 1\n'
    rebuilt, _ = decode_graph(encode_graph(gm, [torch.ones(3, dtype=torch.int64)]))
    radd, rmul = [n for n in rebuilt.graph.nodes if n.op == "call_function"]
    assert source_line(radd) == source_line(add) == "/home/user/train.py:7: y = x + 1"
    assert source_line(rmul) == source_line(mul) == "<unknown source line>"
