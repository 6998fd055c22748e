"""Warm frames never return a wrong result: every guard torch's caching precompile drops comes back.

torch 2.13 drops each guard it can't serialize (object identity: global functions, modules, torch
functions, classes, closures) when packaging a frame, so a rebound global returned the old result;
and a loaded object-aliasing guard (``MODE is FAST``) read a snapshot of the globals.
:mod:`neuron_compile.warm_guards` keeps them in the compiling process and packages each as a
fingerprint checked on every call of the loading process. Two fresh processes run the same module
(the frame key includes its file's sha256, so every change below is made at run time): a cold one
compiles each case, calls it, changes something and calls again; a warm one (its packages loaded:
0 frames traced) calls each case as compiled, then after changes the cold process never saw. Each
result is compared with eager (values, shape, dtype, requires_grad).
"""

from __future__ import annotations

import json
from pathlib import Path

from cache_helpers import run_cases_phase

_CASES = r'''
import json
import os

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters


def helper(x):
    return x * 2


def _helper3(x):
    return x * 3


def f_global_fn(x):
    return helper(x) + 1


SCALE = 2.0


def f_global_const(x):
    return x * SCALE


BIAS = torch.ones(4)


def f_global_tensor(x):
    return x + BIAS


def make_closure(k, act):
    def f_closure(x):
        return act(x) * k
    return f_closure


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.gate = True

    def forward(self, x):
        y = self.lin(x)
        if self.gate:
            y = torch.relu(y)
        if self.training:
            y = y * 0.5
        return y


class Base(torch.nn.Module):
    def act(self, x):
        return torch.sigmoid(x)

    def forward(self, x):
        return self.act(x) + 1


class Other(Base):  # same forward (same frame), another class
    def act(self, x):
        return torch.tanh(x)


class UsesGelu(torch.nn.Module):
    def forward(self, x):
        return F.gelu(x) * 2


class Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


class Mode:
    pass


FAST, SLOW = Mode(), Mode()
MODE = FAST


def f_identity(x):  # object aliasing: Dynamo's lambda guard G['MODE'] is G['FAST']
    return x * 2 if MODE is FAST else x * 3


def f_grad(x):
    return (x * 3).sum(0)


def f_shape(x):
    return torch.softmax(x, -1) * 2


def compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def check(name, fn, eager, *args):
    before = counters["frames"]["total"]
    got = fn(*args)
    traced = counters["frames"]["total"] - before
    want = eager(*args)
    ok = got.shape == want.shape and got.dtype == want.dtype and bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5))
    if want.requires_grad != got.requires_grad:
        ok = False
    return {"case": name, "ok": ok, "traced": traced}


def main():
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    global helper, SCALE, BIAS, MODE
    warm = os.environ["PHASE"] == "warm"
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    base, changed = [], []

    c = compiled(f_global_fn)
    base.append(check("global function", c, f_global_fn, x))
    helper = (lambda x: x - 5) if warm else _helper3  # noqa: E731
    changed.append(check("global function rebound", c, f_global_fn, x))

    c = compiled(f_global_const)
    base.append(check("global constant", c, f_global_const, x))
    SCALE = 7.0 if warm else 5.0
    changed.append(check("global constant rebound", c, f_global_const, x))

    c = compiled(f_global_tensor)
    base.append(check("global tensor", c, f_global_tensor, x))
    BIAS = torch.full((4,), 3.0 if warm else 2.0)
    rebound = check("global tensor rebound", c, f_global_tensor, x)  # a graph input: no retrace needed

    eager = make_closure(2, torch.relu)
    base.append(check("closure", compiled(eager), eager, x))
    for k, act in ([(2, torch.tanh), (4, torch.relu)] if warm else [(3, torch.relu)]):
        eager = make_closure(k, act)
        changed.append(check(f"closure changed ({k}, {act.__name__})", compiled(eager), eager, x))

    model = Flagged().eval()
    c = compiled(model)
    with torch.no_grad():
        base.append(check("module", c, model, x))
        if warm:
            model.train()
        else:
            model.gate = False
        changed.append(check("module flag changed", c, model, x))

    model = Hooked()
    c = compiled(model)
    with torch.no_grad():
        base.append(check("module hooks", c, model, x))
        model.lin.register_forward_hook(lambda m, i, o: o * 10 if warm else o + 1)  # replaces lin's output
        changed.append(check("forward hook registered", c, model, x))

    obj = Base()
    base.append(check("class", compiled(obj), obj, x))
    if warm:
        obj = Other()
        changed.append(check("another class, same forward", compiled(obj), obj, x))

    obj = UsesGelu()
    c = compiled(obj)
    base.append(check("torch function", c, obj, x))
    original = F.gelu
    F.gelu = torch.sigmoid if warm else torch.tanh
    try:
        changed.append(check("torch function monkeypatched", c, obj, x))
    finally:
        F.gelu = original

    c = compiled(f_identity)
    aliasing = [check("object aliasing", c, f_identity, x)]
    MODE = SLOW
    aliasing.append(check("object aliasing changed", c, f_identity, x))

    c = compiled(f_grad)
    base.append(check("requires_grad", c, f_grad, x))
    if warm:
        changed.append(check("requires_grad changed", c, f_grad, x.clone().requires_grad_(True)))

    c = compiled(f_shape)
    base.append(check("shape", c, f_shape, x))
    for y in ([x.half(), torch.randn(2, 7)] if warm else [torch.randn(5, 6)]):
        changed.append(check(f"input changed ({y.dtype}, {tuple(y.shape)})", c, f_shape, y))

    print(json.dumps({"base": base, "changed": changed, "tensor_rebound": rebound, "aliasing": aliasing,
                      "loaded": len(warm_frames.loaded_graphs())}))
'''


def _phase(tmp_path: Path, root: Path, phase: str) -> dict[str, object]:
    return run_cases_phase(tmp_path, root, phase, "frames_cases", _CASES)


def _kinds(root: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["key_parts"]["kind"] for p in (root / "entries").glob("*/manifest.json"))


def test_warm_frames_adversarial_cases_match_eager(tmp_path: Path) -> None:
    """Default settings: a rebound global function (to another function, to a lambda), a rebound global
    constant, tensor and aliased object, a closure over another int or function, a module flag and ``train()``, a
    forward hook registered after the first call (Dynamo skips hook guards by default), another
    class sharing the compiled ``forward``, a monkeypatched ``F.gelu`` (to another builtin), an input
    that requires grad, another shape and dtype: all equal to eager, in the compiling process and in a
    warm one that loaded every package (0 frames traced) and retraced exactly the changed cases."""
    root = tmp_path / "cache"
    cold = _phase(tmp_path, root, "cold")
    assert [c for c in cold["base"] + cold["changed"] if not c["ok"]] == []
    assert cold["tensor_rebound"]["ok"] and [c["ok"] for c in cold["aliasing"]] == [True, True]
    assert all(c["traced"] == 1 for c in cold["base"] + cold["changed"]), cold  # every change recompiled
    assert _kinds(root).count("dynamo-frame") == 11  # one package per compiled function

    warm = _phase(tmp_path, root, "warm")
    assert [c for c in warm["base"] + warm["changed"] if not c["ok"]] == []
    assert warm["loaded"] > 0
    assert [c["case"] for c in warm["base"] if c["traced"]] == []  # loaded from the packages, not traced
    assert [c["case"] for c in warm["changed"] if c["traced"] != 1] == []  # unseen states: guards failed
    assert warm["tensor_rebound"] == {"case": "global tensor rebound", "ok": True, "traced": 0}
    # The aliasing guard read a pickled snapshot of the globals in a loading process (always true):
    # warm_guards makes it read the live ones.
    assert [(c["ok"], c["traced"]) for c in warm["aliasing"]] == [(True, 0), (True, 0)]

