"""Warm frames of modules whose guards' state can't be pickled: the frame is traced as usual, never a crash.

A module with a parametrization (``torch.nn.utils.parametrizations.weight_norm``: wav2vec2, HuBERT, WavLM and
every other model with a weight-normed convolution) refuses to be pickled, and packaging the frame's guards
pickles it: the first compile raised ``InternalTorchDynamoError`` ("Serialization of parametrized modules is only
supported through state_dict()"). Such a frame is now left out of the package, so it compiles (and matches
eager) in the cold process and again in a warm one, and nothing is stored for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from cache_helpers import run_cases_phase

_CASES = r'''
import json
import os

import torch
from torch._dynamo.utils import counters
from torch.nn.utils.parametrizations import weight_norm


class PosConv(torch.nn.Module):  # wav2vec2's positional convolution: a grouped, weight-normed Conv1d
    def __init__(self):
        super().__init__()
        self.conv = weight_norm(torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.conv(x.transpose(1, 2))).transpose(1, 2)


def main():
    import neuron_compile.backend  # noqa: F401

    torch.manual_seed(0)
    model = PosConv()
    x = torch.randn(2, 12, 8)
    before = counters["frames"]["total"]
    got = torch.compile(model, backend="neuron", dynamic=False)(x)
    traced = counters["frames"]["total"] - before
    want = model(x)
    print(json.dumps({"ok": bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5)), "traced": traced}))
'''


def test_parametrized_module_compiles_cold_and_warm(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    for phase in ("cold", "warm"):
        result = run_cases_phase(tmp_path, root, phase, "parametrized_cases", _CASES)
        assert result == {"ok": True, "traced": 1}, (phase, result)
    kinds = [json.loads(p.read_text())["key_parts"]["kind"] for p in (root / "entries").glob("*/manifest.json")]
    assert "dynamo-frame" not in kinds, kinds
