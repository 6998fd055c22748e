"""Helpers shared by the cache tests: synthetic keys and artifacts, fresh-interpreter runners."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from neuron_compile.cache.key import CacheKey, digest_of

REPO = Path(__file__).resolve().parents[2]


def synthetic_key(tag: str = "a", **extra: object) -> CacheKey:
    """A key built from hand-written parts (no torch needed; used by the store tests)."""
    parts: dict[str, object] = {"schema": 1, "kind": "forward", "graph": {"sha256": tag, "nodes": 3,
                                "ops": {"aten.add.Tensor": 1}},
                                "inputs": [{"kind": "tensor", "shape": [2, 3], "dtype": "float32",
                                            "stride": [3, 1], "requires_grad": False, "device": "cpu"}],
                                "extra": dict(extra)}
    return CacheKey(digest=digest_of(parts), parts=parts, graph_text=f"graph {tag}\n")


ARTIFACTS = {"plan.json": b'{"kernels": ["k0_add"]}', "kernels/k0_add.py": b"def k0_add(a, b):\n    return a + b\n"}
SUMMARY = {"kernels": ["k0_add"], "ops": {"aten.add.Tensor": 1}}


# Workers that only exercise the store skip ``neuron_compile/__init__`` (it registers the Dynamo
# backend, importing torch._dynamo: ~3 s per process on this shared 2-core machine). The cache
# modules themselves are the real ones; tests that need the package proper import it normally.
LIGHT_IMPORT = """
import importlib.util, sys, types
_spec = importlib.util.find_spec("neuron_compile")
_pkg = types.ModuleType("neuron_compile")
_pkg.__path__ = list(_spec.submodule_search_locations)
_pkg.__version__ = "0+light"
sys.modules["neuron_compile"] = _pkg
"""


def run_py(code: str, *, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: str | Path | None = None, light: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with the repo importable; returns the completed process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    full_env.update(env or {})
    cmd = [sys.executable, "-c", (LIGHT_IMPORT if light else "") + textwrap.dedent(code)]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO)


def spawn_py(code: str, *, env: dict[str, str] | None = None, light: bool = True) -> subprocess.Popen[str]:
    """Start ``code`` in a fresh interpreter (by default with :data:`LIGHT_IMPORT`)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-c", (LIGHT_IMPORT if light else "") + textwrap.dedent(code)], env=full_env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_cases_phase(tmp_path: Path, root: Path, phase: str, module: str, source: str) -> dict[str, object]:
    """Write ``source`` as ``module``.py and run its ``main()`` in a fresh interpreter with the cache at ``root``
    and ``PHASE=phase`` (a warm-frames case script: cold then warm); no warning may be logged; its last stdout
    line is JSON."""
    import json

    (tmp_path / f"{module}.py").write_text(source)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" \
           "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n" \
           f"import {module}; {module}.main()\n"
    proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(root), "PHASE": phase}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))] == [], proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
