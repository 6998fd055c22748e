"""``neuron-compile precompile SCRIPT [args] --workers N``: compile a job's graphs once, in parallel.

Two phases (like ``neuron_parallel_compile``):

1. **Capture.** The script runs in a child process with ``NEURON_COMPILE_CAPTURE_DIR`` set. The
   backend then records every ATen graph it would compile (:func:`capture_graph`: the graph as
   ``graph.json`` plus its key parts, under ``<dir>/graphs/<digest>.json``) instead of compiling
   it, and returns a runner that executes no kernel: its outputs are zeros with the right shapes,
   strides and dtypes, so the script (forward, backward, optimizer) keeps going. Graphs already in
   the cache are only counted. After ``--steps`` calls of the first graph (a training loop's
   steps) the script is stopped. AOTAutograd still traces during capture, so the warm-start
   entries (:mod:`neuron_compile.warm_start`) are published then; they name the ATen entries the
   second phase creates.
2. **Compile.** The unique graphs are compiled by ``--workers`` processes and published to the
   cache (and the remote tier when configured). A worker decodes the graph, re-derives its key
   (it must equal the recorded digest) and calls the cache's ``get_or_compile``, so workers,
   ranks and hosts sharing a cache never compile a graph twice: the per-key lock makes the others
   wait and then hit. Under ``torchrun`` every rank runs this command; each rank captures its own
   graphs and starts compiling at its own offset of the sorted list (``RANK``/``WORLD_SIZE``), so
   the ranks split the work. A following real run is all cache hits.

Report (text or ``--json``): graphs found (compile calls seen), unique, already cached, compiled
here, waited for (another worker, rank or host was compiling them), fetched (published by another
meanwhile), failed, and seconds per phase.
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
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from neuron_compile.script_args import script_arguments

log = logging.getLogger(__name__)

CAPTURE_ENV = "NEURON_COMPILE_CAPTURE_DIR"
STEPS_ENV = "NEURON_COMPILE_CAPTURE_STEPS"
STOP_MESSAGE = "neuron-compile precompile: captured {steps} step(s); stopping the script"

_calls: dict[str, int] = {}
_first: list[str] = []


# --------------------------------------------------------------------------------------------
# Capture side (called by the backend for every ATen graph while NEURON_COMPILE_CAPTURE_DIR is set)


def capture_dir() -> Path | None:
    """The capture folder (``config.capture_dir``, ``NEURON_COMPILE_CAPTURE_DIR``), or None outside capture mode."""
    from neuron_compile.config import config

    value = config.capture_dir
    return Path(value) if value else None


def _steps() -> int:
    from neuron_compile.config import config

    return int(config.capture_steps)


def capture(gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str) -> Any:
    """The backend's compile step in capture mode: check the graph, key it, record it, fake its run."""
    from neuron_compile.cache.key import compute_key
    from neuron_compile.pipeline import check_lowerable, record_stats

    check_lowerable(gm, f"{kind} graph")
    try:
        key = compute_key(gm, list(example_inputs), kind=kind)
    except Exception as exc:
        log.warning("neuron-compile precompile: no cache key for a %s graph (%s); it will compile at run time",
                    kind, exc)
        key = None
    runner, stats = capture_graph(gm, list(example_inputs), kind, key)
    record_stats(stats)
    return runner


def capture_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str, key: Any) -> tuple[Any, dict[str, Any]]:
    """Record ``gm`` for phase 2 (unless cached) and return ``(runner, stats)``; the runner executes nothing."""
    from neuron_compile.cache.graph_codec import GraphCodecError, encode_graph
    from neuron_compile.cache.store import CacheStore

    folder = capture_dir()
    assert folder is not None
    store = CacheStore.default()
    cached = key is not None and store is not None and store.lookup_local(key) is not None
    status = "cached" if cached else "captured"
    if key is None:
        status = "no-key"
    elif not cached:
        try:
            record = {"kind": kind, "key": key.digest, "parts": key.parts,
                      "graph": encode_graph(gm, example_inputs).decode()}
        except GraphCodecError as exc:
            status = f"not-storable: {exc}"
        else:
            _write_atomic(folder / "graphs" / f"{key.digest}.json", json.dumps(record).encode())
    line = {"kind": kind, "key": key.digest if key is not None else None, "status": status,
            "nodes": sum(1 for n in gm.graph.nodes if n.op == "call_function")}
    _append(folder / "calls.jsonl", json.dumps(line) + "\n")
    stats = {"kind": kind, "kernels": 0, "plan": None, "sources": [], "cache_hit": cached, "ms": 0.0,
             "cache_load_ms": 0.0, "files": None, "key": key.digest if key is not None else None, "captured": True}
    return _fake_runner(gm, key.digest if key is not None else f"nokey-{len(_calls)}"), stats


def _fake_runner(gm: torch.fx.GraphModule, ident: str) -> Any:
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    outs = out_node.args[0]
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in (outs if isinstance(outs, (list, tuple)) else [outs])]
    specs = [(tuple(v.shape), tuple(v.stride()), v.dtype) if isinstance(v, torch.Tensor) else v for v in vals]
    steps = _steps()

    def run(*args: Any) -> list[Any]:
        if not _first:
            _first.append(ident)
        _calls[ident] = _calls.get(ident, 0) + 1
        if ident == _first[0] and _calls[ident] > steps:
            print(STOP_MESSAGE.format(steps=steps), file=sys.stderr, flush=True)
            raise SystemExit(0)
        with torch.no_grad():
            return [torch.empty_strided(s[0], s[1], dtype=s[2]).zero_() if isinstance(s, tuple) else s for s in specs]

    return run


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Compile side (worker processes)


def compile_record(path: str) -> dict[str, Any]:
    """Compile one captured graph into the cache; returns what happened (runs in a worker process)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from neuron_compile.cache.graph_codec import decode_graph
    from neuron_compile.cache.key import compute_key
    from neuron_compile.cache.store import CacheStore
    from neuron_compile.config import config
    from neuron_compile.pipeline import build_artifacts, stored_graph

    start = time.perf_counter()
    record = json.loads(Path(path).read_text())
    digest, parts = record["key"], record["parts"]
    out: dict[str, Any] = {"key": digest, "kind": record["kind"]}
    try:
        gm, inputs = decode_graph(record["graph"].encode())
        with config.patch(**{"target": parts["target"], **parts["codegen"]}):
            key = compute_key(gm, inputs, kind=record["kind"], extra=parts.get("extra") or {})
            if key.digest != digest:
                raise ValueError(f"the recorded graph hashes to {key.digest[:12]}, not {digest[:12]}")
            store = CacheStore.default()
            if store is None:
                raise RuntimeError("the cache is disabled or unusable (see the warning above)")
            compiled = []

            def build() -> tuple[dict[str, bytes], dict[str, Any]]:
                compiled.append(1)
                with unset_fake_temporarily():
                    files, summary, _plan = build_artifacts(gm, inputs)
                    files.update(stored_graph(gm, inputs))
                return files, summary

            out["status"] = _compile_once(store, key, build, compiled)
    except Exception as exc:  # reported per graph; the others still compile
        out["status"] = "failed"
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def _compile_once(store: Any, key: Any, build: Any, compiled: list[int]) -> str:
    """Compile ``key`` unless a worker, rank or host sharing the cache does: ``compiled``/``fetched``/``waited``.

    Hosts sharing only the remote tier coordinate through a claim in Redis: the first claims and
    compiles, the others wait for its entry (then fetch it) instead of compiling it again.
    """
    from neuron_compile.cache.remote import Claim, wait_for_remote
    from neuron_compile.config import config

    if store.lookup(key) is not None:
        return "fetched"  # published meanwhile (another rank or host), locally or in the remote tier
    claim = None
    remote = store.remote
    if remote is not None and remote.disabled is None:
        claim = Claim(remote, key.digest, ttl=float(config.cache_lock_timeout))
        if claim.acquire() is False:
            if wait_for_remote(remote, key, float(config.cache_lock_timeout)) is not None:
                return "waited"
            claim = None  # its holder gave up or is too slow: compile it here
    try:
        _files, hit = store.get_or_compile(key, build)
        if remote is not None:
            remote.flush()
    finally:
        if claim is not None:
            claim.release()
    return "compiled" if compiled else ("waited" if hit else "compiled")


def _init_worker() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")


# --------------------------------------------------------------------------------------------
# The command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                        help="parallel compile processes (default: the number of CPUs)")
    parser.add_argument("--steps", type=int, default=2,
                        help="stop the script after this many calls of its first compiled graph (default 2)")
    parser.add_argument("--capture-dir", metavar="DIR", help="keep the captured graphs here (default: a temp folder)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE ('{rank}' is replaced "
                        "by the torchrun rank)")
    parser.add_argument("script", help="the training or inference script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def _rank() -> tuple[int, int]:
    """This process's torchrun rank and world size (0, 1 outside torchrun); a bad value raises ValueError
    naming the variable."""
    values = []
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1")):
        raw = os.environ.get(name, "").strip() or default
        try:
            values.append(int(raw))
        except ValueError:
            raise ValueError(f"{name}={raw}: expected a non-negative integer (torchrun sets it)") from None
    rank, world = values
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank}, WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE (torchrun sets them)")
    return rank, world


def run(args: argparse.Namespace) -> int:
    script_args = script_arguments(args)
    if args.workers < 1 or args.workers > 1024:
        print(f"neuron-compile precompile: --workers {args.workers}: expected 1..1024", file=sys.stderr)
        return 2
    if args.steps < 1:
        print(f"neuron-compile precompile: --steps {args.steps}: expected an integer >= 1", file=sys.stderr)
        return 2
    try:
        rank, _ = _rank()
    except ValueError as exc:
        print(f"neuron-compile precompile: {exc}", file=sys.stderr)
        return 2
    script = Path(args.script)
    if not script.is_file():
        print(f"neuron-compile precompile: {args.script}: no such file", file=sys.stderr)
        return 2
    # Bad paths are refused before the capture runs the script (minutes), not when the report is written.
    output = args.output.replace("{rank}", str(rank)) if args.output is not None else None
    problem = (output_file_problem("--output", output) if output is not None else None) \
        or (_capture_dir_problem(args.capture_dir) if args.capture_dir is not None else None)
    if problem:
        print(f"neuron-compile precompile: error: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="neuron-compile-capture-") as tmp:
        folder = Path(args.capture_dir) if args.capture_dir else Path(tmp)
        report = precompile(script, script_args, folder, workers=args.workers, steps=args.steps)
    text = json.dumps(report, indent=1, sort_keys=True)
    if args.json:
        print(text)
    else:
        print(render(report))
    if output is not None:
        try:
            Path(output).write_text(text + "\n")
        except OSError as exc:
            print(f"neuron-compile precompile: error: cannot write the report to {output}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
    return 0 if report["script_ok"] and not report["failed"] else 1


def output_file_problem(option: str, name: str) -> str | None:
    """Why ``name`` (the value of ``option``) can't be written as a report file, or None.

    Checked before a command runs the user's script (``precompile``, ``check``), so a typo costs
    seconds, not the whole run.
    """
    if not name.strip():
        return f"{option} needs a file name (e.g. {option} report.json)"
    path = Path(name)
    if path.is_dir():
        return f"{option} {path}: is a directory; give a file name, e.g. {path / 'report.json'}"
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        return f"{option} {path}: the folder {parent} {what}; create it first or choose another path"
    if not os.access(path if path.exists() else parent, os.W_OK):
        return f"{option} {path}: not writable (permission denied or a read-only file system)"
    return None


def _capture_dir_problem(name: str) -> str | None:
    """Why ``--capture-dir name`` can't hold the captured graphs, or None (it is created here if missing)."""
    if not name.strip():
        return "--capture-dir needs a folder name (e.g. --capture-dir captured/)"
    folder = Path(name)
    if folder.exists() and not folder.is_dir():
        return f"--capture-dir {folder}: is a file, not a folder; choose a folder (it is created if missing)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--capture-dir {folder}: cannot create it ({exc.strerror or exc})"
    return None


def precompile(script: Path, script_args: list[str], folder: Path, *, workers: int, steps: int) -> dict[str, Any]:
    """Capture ``script``'s graphs into ``folder``, then compile the unique ones with ``workers`` processes."""
    rank, world = _rank()
    folder = folder / f"rank{rank}" if world > 1 else folder
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, CAPTURE_ENV: str(folder.resolve()), STEPS_ENV: str(steps)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script), *script_args], env=env, stdout=sys.stderr)
    capture_s = time.perf_counter() - t0
    calls = []
    calls_file = folder / "calls.jsonl"
    if calls_file.exists():
        calls = [json.loads(line) for line in calls_file.read_text().splitlines() if line.strip()]
    records = sorted((folder / "graphs").glob("*.json")) if (folder / "graphs").is_dir() else []
    if world > 1 and records:  # ranks start at different offsets of the same sorted list: they split the work
        offset = (len(records) * rank) // world
        records = records[offset:] + records[:offset]
    t1 = time.perf_counter()
    results: list[dict[str, Any]] = []
    if records:
        if workers == 1:
            results = [compile_record(str(p)) for p in records]
        else:
            import multiprocessing

            import neuron_compile.pipeline  # noqa: F401  (imported once here; forked workers inherit it)

            # fork: a spawned worker would re-import torch and the compiler (seconds each); this
            # process has run no torch op and started no thread, so forking it is safe.
            context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
            with ProcessPoolExecutor(max_workers=min(workers, len(records)), initializer=_init_worker,
                                     mp_context=context) as pool:
                results = list(pool.map(compile_record, [str(p) for p in records]))
    compile_s = time.perf_counter() - t1
    unique = {c["key"] for c in calls if c.get("key")}
    return {
        "script": str(script), "argv": script_args, "rank": rank, "world_size": world,
        "script_ok": proc.returncode == 0, "script_exit_code": proc.returncode,
        "graphs_found": len(calls), "unique": len(unique),
        "already_cached": len({c["key"] for c in calls if c.get("status") == "cached"}),
        "compiled": sum(1 for r in results if r["status"] == "compiled"),
        "waited": sum(1 for r in results if r["status"] == "waited"),
        "fetched": sum(1 for r in results if r["status"] == "fetched"),
        "failed": [r for r in results if r["status"] == "failed"],
        "not_storable": sorted({c["status"] for c in calls if str(c.get("status", "")).startswith("not-storable")}),
        "workers": workers, "steps": steps,
        "capture_seconds": round(capture_s, 3), "compile_seconds": round(compile_s, 3),
        "seconds": round(capture_s + compile_s, 3),
        "graphs": results,
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"neuron-compile precompile {report['script']}"
             + (f" (rank {report['rank']} of {report['world_size']})" if report["world_size"] > 1 else ""),
             f"  graphs found:   {report['graphs_found']} ({report['unique']} unique, {report['already_cached']} "
             "already cached)",
             f"  compiled:       {report['compiled']} here, {report['waited'] + report['fetched']} by another "
             f"worker/rank/host, {len(report['failed'])} failed",
             f"  seconds:        {report['seconds']:.1f} (capture {report['capture_seconds']:.1f}, compile "
             f"{report['compile_seconds']:.1f} with {report['workers']} worker(s))"]
    for r in report["failed"]:
        lines.append(f"  FAILED {r['kind']} graph {r['key'][:12]}: {r.get('error', '')}")
    for reason in report["not_storable"]:
        lines.append(f"  not precompiled (compiled at run time instead): {reason}")
    if not report["script_ok"]:
        lines.append(f"  the script exited with status {report['script_exit_code']} during capture")
    return "\n".join(lines)
