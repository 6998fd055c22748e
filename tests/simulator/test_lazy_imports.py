"""Process start: ``ml_dtypes`` is imported on the first bf16/fp8 use only (its import costs seconds)."""

from __future__ import annotations

import os
import subprocess
import sys

_CODE = """
import sys, torch
import neuron_compile
f = torch.compile(lambda x, y: torch.softmax(x @ y, -1) * 2, backend="neuron", dynamic=False)
x, y = torch.randn(8, 16), torch.randn(16, 32)
torch.testing.assert_close(f(x, y), torch.softmax(x @ y, -1) * 2)
print("fp32", "ml_dtypes" in sys.modules)
g = torch.compile(lambda x: (x.to(torch.bfloat16) * 3).float(), backend="neuron", dynamic=False)
torch.testing.assert_close(g(x), (x.to(torch.bfloat16) * 3).float())
print("bf16", "ml_dtypes" in sys.modules)
"""


def test_fp32_model_never_imports_ml_dtypes_and_bf16_still_works() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}, "NEURON_COMPILE_CACHE": "0"}
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["fp32 False", "bf16 True"]
