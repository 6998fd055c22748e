"""``neuron-compile check SCRIPT.py [args] [--json]``: a migration-readiness report for a user script.

The script runs in this process (``runpy``, ``__name__ == "__main__"``, ``sys.argv`` = the script
and its arguments) with the backend in eager-fallback and numeric-check mode (``config.patch`` plus
``NEURON_COMPILE_FALLBACK=eager`` / ``NEURON_COMPILE_CHECK=1`` for any child process). Its stdout is
sent to stderr so that stdout carries only the report. Afterwards :func:`build_report` collects
the compile metrics, fallback records and check results into one report: graphs, ops lowered vs
fallen back (by op, with locations), numeric mismatches, compile times (cold vs cached), estimated
device time and recompiles by shape. A script that raises or compiles nothing still gets a report
for what ran.

Exit status: 0 ready (every op lowered, numerics match), 3 not ready (fallbacks or mismatches),
1 the script failed or compiled no graph, 2 usage. A trailing ``--json`` after the script's
arguments is taken by neuron-compile; put ``--`` before the script's arguments to pass it on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import runpy
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from neuron_compile.script_args import script_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--no-check", action="store_true", help="skip the numeric comparison with eager")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also list every op lowered and every checked output")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def run(args: argparse.Namespace) -> int:
    script_args = script_arguments(args)
    path = Path(args.script)
    if not path.is_file():
        print(f"neuron-compile check: {args.script}: no such file", file=sys.stderr)
        return 2
    if args.output is not None:  # refused before the script runs, not after
        from neuron_compile.precompile import output_file_problem

        problem = output_file_problem("--output", args.output)
        if problem:
            print(f"neuron-compile check: error: {problem}", file=sys.stderr)
            return 2
    report = run_script(path, script_args, check=not args.no_check)
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    print(text if args.json else render_text(report, verbose=args.verbose))
    if args.output is not None:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as exc:
            print(f"neuron-compile check: error: cannot write the report to {args.output}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
    return exit_status(report)


def exit_status(report: dict[str, Any]) -> int:
    if report["error"] is not None or not report["graphs"]:
        return 1
    return 0 if report["ready"] else 3


def run_script(path: Path, script_args: list[str], *, check: bool = True) -> dict[str, Any]:
    """Run ``path`` in fallback (+ check) mode and return the readiness report."""
    import torch  # (registers the backend before the script's first torch.compile)

    import neuron_compile  # noqa: F401
    from neuron_compile import backend, fallback, metrics
    from neuron_compile import check as check_mod
    from neuron_compile.config import config

    backend.reset()
    metrics.reset()
    fallback.clear_fallback_ops()
    check_mod.clear_check_results()
    explicit: list[dict[str, str]] = []
    previous_default = torch.compiler.get_default_backend()
    real_compile = torch.compile
    torch.compiler.set_default_backend("neuron")  # plain torch.compile(model) in the script uses neuron

    def recording_compile(*a: Any, **kw: Any) -> Any:
        backend = kw.get("backend")
        if backend is not None and backend not in ("neuron", "neuron_compile"):
            caller = traceback.extract_stack(limit=2)[0]
            explicit.append({"backend": getattr(backend, "__name__", str(backend)),
                             "location": f"{caller.filename}:{caller.lineno}"})
        return real_compile(*a, **kw)

    torch.compile = recording_compile  # type: ignore[assignment]
    env = {"NEURON_COMPILE_FALLBACK": "eager", "NEURON_COMPILE_CHECK": "1" if check else "0"}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    error: dict[str, Any] | None = None
    exit_code: int | str | None = 0
    start = time.perf_counter()
    os.environ.update(env)
    sys.argv = [str(path), *script_args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        with config.patch(fallback="eager", check=check), contextlib.redirect_stdout(sys.stderr):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        exit_code = exc.code
        if exc.code not in (None, 0):
            error = {"type": "SystemExit", "message": f"the script exited with status {exc.code}",
                     "location": ""}
    except BaseException as exc:  # noqa: BLE001  (any failure of the user's script goes in the report)
        error = _describe_exception(exc, path)
        exit_code = None
    finally:
        torch.compile = real_compile  # type: ignore[assignment]
        torch.compiler.set_default_backend(previous_default)
        sys.argv, sys.path[:] = saved_argv, saved_path
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    report = build_report(metrics.records(), fallback.get_fallback_ops(), check_mod.get_check_results(),
                          checked=check)
    report.update({"script": str(path), "argv": script_args, "error": error, "exit_code": exit_code,
                   "wall_s": round(time.perf_counter() - start, 3), "other_backends": explicit})
    if error is not None:
        report["ready"] = False
        report["verdict"] = (f"neuron-compile failed (a backend error, not your code): {error['type']}: "
                             f"{error['message']}; please report it with the stack below"
                             if error.get("backend_error") else
                             f"the script failed: {error['type']}: {error['message']}")
    elif not report["graphs"]:
        report["verdict"] = ("no graph was compiled with backend='neuron'"
                             + (f" (the script names backend={explicit[0]['backend']!r} explicitly at "
                                f"{explicit[0]['location']}: remove backend= or pass backend='neuron')"
                                if explicit else ": call torch.compile(model) or model.compile() in the script"))
    return report


_PACKAGE = Path(__file__).resolve().parent.parent  # the checkout: neuron_compile/, lowering/, codegen/, cache/


def _ours(filename: str) -> bool:
    try:
        rel = Path(filename).resolve().relative_to(_PACKAGE)
    except ValueError:
        return False
    return rel.parts[0] in ("neuron_compile", "lowering", "codegen", "cache")


def _describe_exception(exc: BaseException, path: Path) -> dict[str, Any]:
    """The script's failure: a refusal or error of the user's code at the user's line, or a failure inside
    neuron-compile (a backend error: reported as ours, with our frames, never blamed on the user's line)."""
    from neuron_compile.errors import DynamicShapeError, NeuronCompileError, UnsupportedOpError

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = getattr(seen, "inner_exception", None) or seen.__cause__  # explicit chains only
    root = chain[-1]
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    runner = {Path(__file__).resolve(), Path(__file__).resolve().with_name("cli.py")}  # they run the script
    backend_frames = [f for f in traceback.extract_tb(root.__traceback__)
                      if _ours(f.filename) and Path(f.filename).resolve() not in runner]
    user_facing = isinstance(root, (UnsupportedOpError, DynamicShapeError)) or (
        isinstance(root, NeuronCompileError) and not backend_frames)
    internal = bool(backend_frames) and not user_facing
    mine = [f for f in frames if Path(f.filename).resolve() == path.resolve()]
    where = backend_frames[-1] if internal else (mine[-1] if mine else (frames[-1] if frames else None))
    message = str(root if internal else exc).strip().splitlines()
    out = {"type": type(root if internal else exc).__name__, "message": message[0] if message else "",
           "detail": str(exc).strip()[:2000], "backend_error": internal,
           "location": f"{where.filename}:{where.lineno}: {where.line or ''}".rstrip(": ") if where else ""}
    if internal:
        out["backend_stack"] = [f"{f.filename}:{f.lineno} in {f.name}" for f in backend_frames[-12:]]
        calls = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        out["script_line"] = (f"{calls[-1].filename}:{calls[-1].lineno}: {calls[-1].line or ''}".rstrip(": ")
                              if calls else "")
    return out


def build_report(records: list[Any], fallback_ops: list[dict[str, Any]], checks: list[dict[str, Any]], *,
                 checked: bool = True) -> dict[str, Any]:
    """The readiness report from metrics records, fallback records and check results."""
    from neuron_compile.lowering.registry import qualified_name

    lowered: Counter[str] = Counter()
    for rec in records:
        for unit in rec.units:
            for node in unit.gm.graph.nodes:
                if node.op == "call_function" and qualified_name(node.target) != "_operator.getitem":
                    lowered[qualified_name(node.target)] += 1
    cold = [r for r in records if r.cache != "hit"]
    warm = [r for r in records if r.cache == "hit"]
    estimates = [r.device_estimate() for r in records]
    mismatches = [c for c in checks if c["mismatched_calls"]]
    frames: dict[str, dict[str, Any]] = defaultdict(lambda: {"compiles": 0, "shapes": [], "dtypes": [],
                                                             "location": ""})
    for r in records:
        if r.kind == "backward":  # compiled with its forward: one compile of the frame
            continue
        frame = r.compile_id.split("/")[0] if "/" in r.compile_id else r.location
        f = frames[frame]
        f["location"] = f["location"] or r.location
        f["compiles"] += 1
        f["shapes"].append(r.input_shapes)
        f["dtypes"].append(getattr(r, "input_dtypes", []) or [""] * len(r.input_shapes))
    recompiles = []
    for k, v in frames.items():
        if v["compiles"] < 2:
            continue
        sigs = [list(zip(sh, dt, strict=False)) for sh, dt in zip(v["shapes"], v["dtypes"], strict=True)]
        width = min(len(s) for s in sigs)
        changes: dict[str, Any] = {}
        for i in range(width):
            if len({tuple(s[i][0]) for s in sigs}) > 1:
                changes[f"input {i} shape"] = [s[i][0] for s in sigs]
            if len({s[i][1] for s in sigs}) > 1:
                changes[f"input {i} dtype"] = [s[i][1] for s in sigs]
        recompiles.append({"frame": k, "compiles": v["compiles"], "location": v["location"], "changes": changes})
    n_fallback = sum(op["count"] for op in fallback_ops)
    ready = bool(records) and not n_fallback and not mismatches
    if ready:
        verdict = "ready: every op lowered" + (", numerics match eager" if checked else "")
    elif records:
        parts = []
        if n_fallback:
            parts.append(f"{len(fallback_ops)} op(s) fell back to eager ({', '.join(op['op'] for op in fallback_ops)}; "
                         f"{n_fallback} node(s))")
        if mismatches:
            parts.append(f"{len(mismatches)} graph(s) differ from eager")
        verdict = "not ready: " + "; ".join(parts)
    else:
        verdict = "no graph compiled"
    return {
        "ready": ready, "verdict": verdict, "checked": checked,
        "graphs": [r.to_json() for r in records],
        "ops_lowered": dict(sorted(lowered.items())),
        "ops_fallen_back": fallback_ops,
        "mismatches": mismatches,
        "checks": checks,
        "compile_ms": {"cold": round(sum(r.total_ms for r in cold), 1), "cold_graphs": len(cold),
                       "cached": round(sum(r.total_ms for r in warm), 1), "cached_graphs": len(warm)},
        "est_device_us": round(sum(e for e in estimates if e is not None), 3)
        if estimates and all(e is not None for e in estimates) else None,
        "recompiles": recompiles,
    }


def render_text(report: dict[str, Any], verbose: bool = False) -> str:
    """The human-readable report: a summary, then what needs attention (``verbose``: everything)."""
    out = [f"neuron-compile check: {report.get('script', '')}", f"verdict: {report['verdict']}"]
    if report.get("error"):
        e = report["error"]
        if e.get("backend_error"):
            out.append(f"backend error: {e['type']}: {e['message']}")
            out += [f"  {line}" for line in e.get("backend_stack", [])]
            if e.get("script_line"):
                out.append(f"  (while running the script at {e['script_line']})")
        else:
            out.append(f"script error: {e['type']}: {e['message']}" + (f"\n  at {e['location']}" if e["location"] else ""))
    for other in report.get("other_backends", []):
        out.append(f"note: torch.compile(backend={other['backend']!r}) at {other['location']} keeps its explicit "
                   f"backend (not evaluated)")
    graphs = report["graphs"]
    out.append(f"\ngraphs: {len(graphs)}")
    for g in graphs if verbose or len(graphs) <= 8 else []:
        est = f", est. device {g['est_device_us']:.1f} us" if g.get("est_device_us") is not None else ""
        fb = f", {g['fallback_ops']} eager op(s)" if g["fallback_ops"] else ""
        shapes = g["input_shapes"]
        shown = ", ".join(str(x) for x in shapes[:3]) + (f", ... ({len(shapes)} inputs)" if len(shapes) > 3 else "")
        out.append(f"  {g['name']:<16} {g['location']}  inputs {shown}: {g['nodes']} nodes -> "
                   f"{g['kernels']} kernels{fb}, cache {g['cache']}, {g['total_ms']:.0f} ms{est}")
    lowered = report["ops_lowered"]
    out.append(f"\nops lowered: {len(lowered)} distinct, {sum(lowered.values())} nodes")
    if lowered and verbose:
        out.append("  " + ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in lowered.items()))
    fb = report["ops_fallen_back"]
    out.append(f"ops fallen back to eager: {len(fb)} distinct, {sum(o['count'] for o in fb)} nodes")
    for op in fb:
        out.append(f"  {op['op']} x{op['count']} ({op['calls']} call(s)) inputs {'; '.join(op['signatures'])}: "
                   f"{'; '.join(op['reasons'])}")
        out += [f"    at {loc}" for loc in op["locations"]]
    out.append(f"\nnumeric check: {'off' if not report['checked'] else str(len(report['checks'])) + ' graph(s) checked'}"
               f", {len(report['mismatches'])} mismatching")
    for c in report["checks"]:
        if not verbose and not c["mismatched_calls"]:
            continue
        status = "MISMATCH" if c["mismatched_calls"] else "ok"
        out.append(f"  {c['graph']:<16} {status} ({c['mismatched_calls']}/{c['calls']} calls differ)")
        for o in c["outputs"]:
            if not verbose and o["ok"]:
                continue
            out.append(f"    output {o['index']} {o['dtype']}{o['shape']}: max abs {o['max_abs']:.3g}, "
                       f"max rel {o['max_rel']:.3g}{'' if o['ok'] else '  <-- beyond tolerance'}")
        div = c.get("first_divergence")
        if div and "kernel" in div:
            out.append(f"    first diverging kernel: {div['kernel']} [{div['family']}] ops {', '.join(div['ops'])}")
            out += [f"      at {line}" for line in div["source_lines"]]
        elif div:
            out.append(f"    per-kernel diagnosis failed: {div.get('error')}")
    cm = report["compile_ms"]
    out.append(f"\ncompile time: cold {cm['cold']:.0f} ms ({cm['cold_graphs']} graph(s)), cached {cm['cached']:.0f} ms "
               f"({cm['cached_graphs']} graph(s))")
    est = report["est_device_us"]
    out.append("estimated device time (compiled kernels, eager ops excluded): " + (f"{est:.1f} us per run of every graph" if est is not None
                                            else "n/a (no cost model estimate)"))
    rc = report["recompiles"]
    out.append(f"recompiles: {'none' if not rc else ''}")
    for r in rc:
        vary = "; ".join(f"{what}: " + " -> ".join(str(x) for x in seq) for what, seq in r["changes"].items())
        out.append(f"  {r['location']}: {r['compiles']} compiles; {vary or 'same shapes and dtypes'}")
    if "wall_s" in report:
        out.append(f"\nscript wall time: {report['wall_s']:.1f} s")
    return "\n".join(out)
