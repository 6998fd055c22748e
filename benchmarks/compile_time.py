"""Cold compile time of the quickstart GPT: ``backend="neuron"`` against ``backend="inductor"``, same run.

Run ``python benchmarks/compile_time.py`` (``--help`` for repeats and model size). Each measurement is
a fresh Python process (``--worker``) with an empty temporary ``NEURON_COMPILE_CACHE_DIR`` and a fresh
``TORCHINDUCTOR_CACHE_DIR``, so nothing is reused from earlier compiles. In the worker, after imports
and one eager call (both backends pay the same), it times ``torch.compile(model)`` plus the first call
(the cold compile + first run, including the lazy import of the backend's own package), then the steady-state time of further calls, and compares the result
with eager. The parent prints each run, the best of N per backend, the neuron/inductor ratio against
the target (<= 0.25x Inductor's cold time) and the steady-state run time of the simulator vs eager.
It only reports: exit status 0 unless a worker crashed (then the worker's error is printed, status 1).
The model is ``examples/models.py`` GPT with the config of ``examples/quickstart.py``.

``--zoo [NAME,...]`` times the model zoo of the test suite (``tests/models/zoo.py``: Hugging Face models with
attention masks, torch.nn modules, CNN and diffusion blocks) instead: per model and mode (inference, one
training step) a fresh process per backend, the cold compile + first call, graphs and kernels, and the max
error vs eager (relative to the largest output / gradient magnitude); then the zoo table and the
neuron/inductor ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.25
BACKENDS = ("neuron", "inductor")
MARK = "COMPILE_TIME_RESULT "


def worker(backend: str, layers: int, batch: int, seq: int, steady_runs: int) -> dict[str, Any]:
    """One cold compile in this (fresh) process; returns timings and the max error vs eager."""
    t_start = time.perf_counter()
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from models import GPT, GPTConfig

    # neuron_compile is not imported here: backend="neuron" resolves through the torch_dynamo_backends entry
    # point inside torch.compile, so its import cost is part of the cold time (as Inductor's imports are).
    t_imports = time.perf_counter()

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=512, seq=seq, d_model=128, n_heads=4, n_layers=layers)  # examples/quickstart.py
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq))
    with torch.no_grad():
        expected = model(idx)
        eager = []
        for _ in range(steady_runs):
            t0 = time.perf_counter()
            model(idx)
            eager.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        compiled = torch.compile(model, backend=backend, dynamic=False)
        got = compiled(idx)
        cold = time.perf_counter() - t0
        steady = []
        for _ in range(steady_runs):
            t0 = time.perf_counter()
            compiled(idx)
            steady.append(time.perf_counter() - t0)
    result: dict[str, Any] = {
        "backend": backend, "cold_s": cold, "imports_s": t_imports - t_start,
        "steady_s": min(steady), "eager_s": min(eager),
        "max_err": (got - expected).abs().max().item(),
    }
    if backend == "neuron":
        from neuron_compile.backend import compiled_graphs

        graphs = compiled_graphs()
        result["graphs"] = len(graphs)
        result["kernels"] = sum(g["kernels"] for g in graphs)
        result["cache_hits"] = sum(bool(g["cache_hit"]) for g in graphs)
    return result


def _empty_caches_env(tmp: str) -> dict[str, str]:
    """This process's environment with every compile cache (ours, Inductor's, Triton's) in the empty ``tmp``."""
    env = dict(os.environ)
    env["NEURON_COMPILE_CACHE_DIR"] = str(Path(tmp) / "neuron-cache")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor-cache")
    env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton-cache")
    env.pop("NEURON_COMPILE_CACHE", None)
    return env


def zoo_worker(backend: str, name: str, mode: str) -> dict[str, Any]:
    """One cold compile of zoo model ``name`` (``mode``: inference | training) in this fresh process."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from zoo import ZOO, first_tensor, loss_of

    entry = next(e for e in ZOO if e.name == name)
    torch.backends.mha.set_fastpath_enabled(False)  # the Python path, the one Dynamo traces (as the zoo tests)
    model, inputs = entry.build()
    if mode == "training":
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    torch.manual_seed(0)
    if mode == "inference":
        with torch.no_grad():
            expected = {"output": first_tensor(model(**inputs))}
    else:
        loss_of(model(**inputs)).backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    torch.manual_seed(0)
    if mode == "inference":
        with torch.no_grad():
            got = {"output": first_tensor(compiled(**inputs))}
    else:  # eager's gradients (AOTAutograd also gives zeros where eager leaves None, e.g. an unused pooler)
        loss_of(compiled(**inputs)).backward()
        got = dict(model.named_parameters())
        got = {n: got[n].grad for n in expected}
    cold = time.perf_counter() - t0
    scale = max(float(e.abs().max()) for e in expected.values()) + 1e-12
    err = max(float((got[n].float() - e.float()).abs().max()) for n, e in expected.items()) / scale
    result: dict[str, Any] = {"backend": backend, "model": name, "mode": mode, "cold_s": cold, "rel_err": err}
    if backend == "neuron":
        from neuron_compile.backend import compiled_graphs

        graphs = compiled_graphs()
        result["graphs"] = len(graphs)
        result["kernels"] = sum(g["kernels"] for g in graphs)
    return result


def run_zoo_worker(backend: str, name: str, mode: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    with tempfile.TemporaryDirectory(prefix="nc-bench-") as tmp:
        env = _empty_caches_env(tmp)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--zoo-worker", backend, name, mode]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s"
    for line in proc.stdout.splitlines():
        if line.startswith(MARK) and proc.returncode == 0:
            return json.loads(line[len(MARK):]), ""
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    refusal = next((ln.strip() for ln in lines if "UnsupportedOpError" in ln), "")
    return None, refusal or f"exit status {proc.returncode}: {lines[-1] if lines else ''}"


def zoo_main(names: list[str], timeout: float) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from zoo import ZOO

    entries = [e for e in ZOO if not names or e.name in names]
    print(f"model zoo (tests/models/zoo.py): {len(entries)} models x (inference, training), fp32; "
          "each cell a fresh process with empty caches")
    print(f"{'model':22s} {'mode':10s} {'neuron':>8s} {'inductor':>9s} {'ratio':>6s} {'graphs':>6s} "
          f"{'kernels':>7s} {'rel err':>9s}")
    ratios, failed = [], 0
    for e in entries:
        for mode in ("inference", "training"):
            res = {b: run_zoo_worker(b, e.name, mode, timeout) for b in BACKENDS}
            n, ind = res["neuron"][0], res["inductor"][0]
            if n is None:
                failed += 1
                print(f"{e.name:22s} {mode:10s} neuron FAILED: {res['neuron'][1][:160]}")
                continue
            ratio = n["cold_s"] / ind["cold_s"] if ind else float("nan")
            if ind:
                ratios.append(ratio)
            print(f"{e.name:22s} {mode:10s} {n['cold_s']:7.2f}s {ind['cold_s'] if ind else float('nan'):8.2f}s "
                  f"{ratio:6.3f} {n['graphs']:6d} {n['kernels']:7d} {n['rel_err']:9.2e}")
    if ratios:
        ratios.sort()
        print(f"\nneuron / inductor cold compile: median {ratios[len(ratios) // 2]:.3f}x, worst {ratios[-1]:.3f}x "
              f"(target <= {TARGET_RATIO}x: {'met' if ratios[-1] <= TARGET_RATIO else 'NOT met'} on every model)")
    return 1 if failed else 0


def run_worker(backend: str, args: argparse.Namespace) -> tuple[dict[str, Any] | None, str, float]:
    """A fresh process with empty caches; returns (result or None, error text, process wall time)."""
    with tempfile.TemporaryDirectory(prefix="nc-bench-") as tmp:
        env = _empty_caches_env(tmp)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--layers", str(args.layers),
               "--batch", str(args.batch), "--seq", str(args.seq), "--steady-runs", str(args.steady_runs)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=tmp)
        wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(MARK) and proc.returncode == 0:
            return json.loads(line[len(MARK):]), "", wall
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
    return None, f"exit status {proc.returncode}:\n{tail}", wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold runs per backend (best is reported)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steady-runs", type=int, default=3, help="warm calls timed per process (min reported)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per worker process")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--zoo", nargs="?", const="", default=None, metavar="NAME,...",
                        help="time the test suite's model zoo (all models, or the listed ones) instead")
    parser.add_argument("--zoo-worker", nargs=3, metavar=("BACKEND", "MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.zoo_worker:
        print(MARK + json.dumps(zoo_worker(*args.zoo_worker)), flush=True)
        return 0
    if args.zoo is not None:
        return zoo_main([n for n in args.zoo.split(",") if n], args.timeout)

    if args.worker:
        result = worker(args.worker, args.layers, args.batch, args.seq, args.steady_runs)
        print(MARK + json.dumps(result), flush=True)
        return 0

    print(f"quickstart GPT: {args.layers} layers, d_model=128, heads=4, vocab=512, batch={args.batch}, "
          f"seq={args.seq}; {args.repeats} cold runs per backend, each a fresh process with empty caches")
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in args.backends}
    failures: dict[str, str] = {}
    # Interleave backends so machine load drifts affect both alike.
    for rep in range(args.repeats):
        for backend in args.backends:
            if backend in failures:
                continue
            res, err, wall = run_worker(backend, args)
            if res is None:
                failures[backend] = err
                print(f"  run {rep + 1} {backend:8s}: FAILED ({err.splitlines()[0]})")
                continue
            res["process_s"] = wall
            results[backend].append(res)
            extra = f", {res['graphs']} graph(s), {res['kernels']} kernels, cache hits {res['cache_hits']}" \
                if backend == "neuron" else ""
            print(f"  run {rep + 1} {backend:8s}: cold compile + first call {res['cold_s']:7.2f} s "
                  f"(process {wall:6.2f} s, imports {res['imports_s']:.2f} s), steady {res['steady_s'] * 1000:8.1f} ms, "
                  f"max |err| vs eager {res['max_err']:.2e}{extra}")

    best = {b: min(rs, key=lambda r: r["cold_s"]) for b, rs in results.items() if rs}
    print()
    for backend, res in best.items():
        print(f"best cold compile + first call, {backend:8s}: {res['cold_s']:.2f} s")
    if "neuron" in best and "inductor" in best:
        ratio = best["neuron"]["cold_s"] / best["inductor"]["cold_s"]
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(f"neuron / inductor cold time: {ratio:.3f}x (target <= {TARGET_RATIO}x: {verdict})")
        procs = {b: min(r["process_s"] for r in results[b]) for b in ("neuron", "inductor")}
        print(f"whole fresh process (python start, imports, eager, compile, runs): neuron {procs['neuron']:.2f} s, "
              f"inductor {procs['inductor']:.2f} s ({procs['neuron'] / procs['inductor']:.3f}x)")
    if "neuron" in best:
        sim = min(r["steady_s"] for r in results["neuron"])
        eager = min(r["eager_s"] for rs in results.values() for r in rs)
        print(f"steady-state run: simulator {sim * 1000:.1f} ms vs eager {eager * 1000:.2f} ms "
              f"({sim / eager:.0f}x eager)")
    if "inductor" in best:
        ind = min(r["steady_s"] for r in results["inductor"])
        print(f"steady-state run: inductor {ind * 1000:.2f} ms")
    for backend, err in failures.items():
        print(f"\n{backend} FAILED (a cold compile crashed; no figure for it):\n{err}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
