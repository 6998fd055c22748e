"""Warm frames of models that keep a config object: plain configs fingerprinted by state, soundly.

Hugging Face models deep-copy their config inside ``forward`` (T5, through ``get_text_config``), and
``copy.deepcopy`` keys its memo by ``id()``, so Dynamo guards the identity of the config, its ``__dict__``
and each value (ID_MATCH). :mod:`neuron_compile.warm_guards` packages such a guard as the object's type and a
digest of its state when the identity was used by ``copy`` only, keeps two sources that held one object
aliased (and refuses distinct objects with equal state, or an identity used anywhere else), so a loading
process retraces whenever the compiling one would have returned something else. Two fresh processes run
the same module (the frame key includes its file's sha256): a cold one compiles each case; a warm one loads
the packages (0 graphs compiled) and then changes configs in ways the cold process never saw. Every
result is compared with eager.
"""

from __future__ import annotations

from pathlib import Path

from cache_helpers import run_cases_phase

_CASES = r'''
import copy
import dataclasses
import json
import os

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters


@dataclasses.dataclass
class Cfg:  # a plain config object, as Hugging Face models keep one (a dataclass here)
    hidden: int = 8
    act: str = "gelu"
    scale: float = 2.0
    sizes: tuple = (1, 2)
    extra: dict = dataclasses.field(default_factory=lambda: {"k": 1.0})


class Block(torch.nn.Module):
    """HF-like: keeps its config and deep-copies it in forward (as transformers' get_text_config does)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lin = torch.nn.Linear(config.hidden, config.hidden)

    def forward(self, x):
        cfg = copy.deepcopy(self.config)
        y = self.lin(x)
        y = F.gelu(y) if cfg.act == "gelu" else torch.relu(y)
        return y * cfg.scale + cfg.extra["k"]


class BreakBlock(Block):
    """The same with a graph break in forward: the rest runs in a Dynamo resume frame."""

    def forward(self, x):
        cfg = copy.deepcopy(self.config)
        y = self.lin(x)
        torch._dynamo.graph_break()
        y = F.gelu(y) if cfg.act == "gelu" else torch.relu(y)
        return y * cfg.scale + cfg.extra["k"]


class Shared(torch.nn.Module):
    """One config object at two places (the model and its layer), both deep-copied."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.inner = Block(config)

    def forward(self, x):
        a = copy.deepcopy(self.config)
        b = copy.deepcopy(self.inner.config)
        return self.inner(x) * a.scale + b.scale


class Pair(torch.nn.Module):
    """Two distinct config objects with equal values, both deep-copied: which is which can't be checked by value."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Cfg(), Cfg()

    def forward(self, x):
        return x * copy.deepcopy(self.a).scale + copy.deepcopy(self.b).scale


TAG = Cfg()


def f_id(x):  # the number id() returns is part of the result: no value can stand for the identity
    return x + id(TAG) % 7


def compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def check(name, fn, eager, x):
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        got = fn(x)
        want = eager(x)
    ok = got.shape == want.shape and got.dtype == want.dtype and bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5))
    return {"case": name, "ok": ok, "traced": counters["stats"]["unique_graphs"] - before}


def main():
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    warm = os.environ["PHASE"] == "warm"
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    out = []

    m = Block(Cfg()).eval()
    c = compiled(m)
    out.append(check("config", c, m, x))
    m.config.scale = 3.0  # the cold process saw this state too
    out.append(check("config mutated (seen cold)", c, m, x))
    if warm:
        m.config.scale = 5.0
        out.append(check("config mutated (unseen)", c, m, x))
        m.config.act = "relu"
        out.append(check("config act changed", c, m, x))
        m.config.extra["k"] = 4.0
        out.append(check("nested config value changed", c, m, x))
        m.config = Cfg()
        out.append(check("another config object, equal values", c, m, x))
        m.config = Cfg(scale=0.5, sizes=(3,))
        out.append(check("another config object, other values", c, m, x))

    m = BreakBlock(Cfg()).eval()
    c = compiled(m)
    out.append(check("graph break", c, m, x))
    if warm:
        m.config.scale = 7.0
        out.append(check("graph break, config mutated", c, m, x))

    m = Shared(Cfg()).eval()
    c = compiled(m)
    out.append(check("shared config", c, m, x))
    if warm:
        m.inner.config = Cfg()  # equal values, but no longer the same object as m.config
        out.append(check("shared config split", c, m, x))

    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None:  # a Hugging Face config object (what T5 deep-copies in its forward)
        transformers.logging.set_verbosity_error()
        m = Block(transformers.PretrainedConfig(hidden=8, act="gelu", scale=2.0, extra={"k": 1.0})).eval()
        out.append(check("HF config", compiled(m), m, x))
        if warm:
            m.config.scale = 6.0
            out.append(check("HF config mutated", compiled(m), m, x))

    m = Pair().eval()
    out.append(check("two equal configs", compiled(m), m, x))
    out.append(check("id() in the result", compiled(f_id), f_id, x))
    print(json.dumps({"cases": out, "loaded": len(warm_frames.loaded_graphs())}))

'''


def _phase(tmp_path: Path, root: Path, phase: str) -> dict[str, object]:
    return run_cases_phase(tmp_path, root, phase, "config_cases", _CASES)


def test_warm_frames_with_config_objects_match_eager(tmp_path: Path) -> None:
    """A deep-copied dataclass config (and a Hugging Face ``PretrainedConfig`` when transformers is installed),
    the same in a ``forward`` with a graph break (its resume frame is packaged too) and one config object shared
    by a model and its layer: loaded without tracing in a warm process, equal to eager; a config mutated to a state
    the cold process saw is loaded too; any unseen value (top-level, nested in a dict, the activation's name),
    another config object with other values, and a shared config split into two objects retrace. Frames whose
    config identities can't be checked by value are not packaged: two distinct configs with equal values
    (which one is which?) and ``id(config)`` in the result."""
    root = tmp_path / "cache"
    cold = _phase(tmp_path, root, "cold")
    assert [c for c in cold["cases"] if not c["ok"]] == []
    traced = {c["case"]: c["traced"] for c in cold["cases"]}
    assert traced.pop("graph break") == 2 and set(traced.values()) == {1}, cold  # the break: 2 frames

    warm = _phase(tmp_path, root, "warm")
    assert [c for c in warm["cases"] if not c["ok"]] == []
    traced = {c["case"]: c["traced"] for c in warm["cases"]}
    loaded = {"config", "config mutated (seen cold)", "another config object, equal values", "graph break",
              "shared config", "HF config"}
    assert {k for k, v in traced.items() if v == 0} == loaded & set(traced), warm
    assert traced.pop("graph break, config mutated") == 2  # both frames read the copied config
    assert {k: v for k, v in traced.items() if k not in loaded} == {
        "config mutated (unseen)": 1, "config act changed": 1, "nested config value changed": 1,
        "another config object, other values": 1, "shared config split": 1, "two equal configs": 1,
        "id() in the result": 1, **({"HF config mutated": 1} if "HF config" in traced else {})}, warm
    assert warm["loaded"] >= 4
