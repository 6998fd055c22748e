"""``neuron-compile precompile`` on a training script: graphs, seconds with 1 and 2 workers, then a real run.

For each worker count, on a fresh cache: ``neuron-compile precompile --workers N SCRIPT`` (capture +
parallel compile), then the script itself, whose graphs must all be cache hits. Printed side by
side: graphs found / unique / compiled, capture and compile seconds, the real run's hits and its
first-step time against a run on a cold cache.

Run: ``python benchmarks/precompile.py [--script examples/train.py] [--workers 1,2]``; a zoo model:
``--script "benchmarks/zoo_train.py llama"``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    env["NEURON_COMPILE_CACHE_DIR"] = str(root)
    return env


def precompile(script: list[str], workers: int, root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "neuron_compile", "precompile", "--workers", str(workers), "--json",
                           *script], env=_env(root), capture_output=True, text=True, cwd=REPO, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"precompile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def real_run(script: list[str], root: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *script], env=_env(root), capture_output=True, text=True, cwd=REPO,
                          timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(script)} failed:\n{proc.stderr[-3000:]}")
    stats = subprocess.run([sys.executable, "-m", "neuron_compile", "cache", "stats", "--json"], env=_env(root),
                           capture_output=True, text=True, cwd=REPO, timeout=600)
    return wall, json.loads(stats.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default="examples/train.py",
                        help='the script and its arguments, e.g. "benchmarks/zoo_train.py llama --steps 2"')
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    script = shlex.split(args.script)
    with tempfile.TemporaryDirectory() as tmp:
        cold_wall, _ = real_run(script, Path(tmp) / "cold")
    print(f"{args.script}: a real run on a cold cache takes {cold_wall:.1f} s (process wall time)")
    print(f"{'workers':>7} {'found':>6} {'unique':>6} {'compiled':>8} {'capture s':>9} {'compile s':>9} {'total s':>8} "
          f"{'real run s':>10} {'real-run hits/misses':>20}")
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "cache"
            rep = precompile(script, workers, root)
            before = {"hits": 0, "misses": rep["compiled"]}
            wall, stats = real_run(script, root)
            hits, misses = stats["hits"] - before["hits"], stats["misses"] - before["misses"]
            print(f"{workers:>7} {rep['graphs_found']:>6} {rep['unique']:>6} {rep['compiled']:>8} "
                  f"{rep['capture_seconds']:>9.1f} {rep['compile_seconds']:>9.1f} {rep['seconds']:>8.1f} "
                  f"{wall:>10.1f} {f'{hits}/{misses}':>20}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
