"""Run the test suite on every core: the test files split into shards, one pytest process per shard.

    python tests/run.py                  # as many shards as cores (at most 2 on a 2-core machine)
    python tests/run.py -j 1             # one plain pytest process
    python tests/run.py -- -x -k cache   # arguments after ``--`` go to every pytest process
    python tests/run.py --record         # also rewrite tests/durations.json from this run's timings

Most of the suite is single-threaded Python (Dynamo, lowering, the simulator), so one pytest process keeps
one core busy. The unit of a shard is a test file (module fixtures, e.g. the examples run together in
test_examples.py, stay in one process); files are dealt out longest first to the least loaded shard, by the
seconds recorded per file in ``tests/durations.json`` (a file not listed there counts as the median). Each
shard's output is printed as it comes, prefixed with its number, then one summary line for the whole run.
Exit status: 0 when every shard passed, else the first failing shard's pytest status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "durations.json"
NO_TESTS = 5  # pytest's exit status when a process collected nothing (e.g. -k matched nothing in that shard)


def test_files(root: Path = TESTS) -> list[str]:
    """Every test module under ``root``, as paths relative to the repository (pytest's node-id prefix)."""
    return sorted(p.relative_to(root.parent).as_posix() for p in root.rglob("test_*.py"))


def select(pytest_args: list[str]) -> tuple[list[str], list[str]]:
    """(test files to deal out, the other pytest arguments). Paths among the arguments (test files or folders,
    relative to the repository) narrow the files to theirs; a node id (``file::test``) is not split: it stays
    an argument and one process runs it (no files are dealt out)."""
    repo = TESTS.parent
    paths = [a for a in pytest_args if not a.startswith("-") and "::" not in a and (repo / a).exists()]
    options = [a for a in pytest_args if a not in paths]
    if any("::" in a for a in options):
        return [], pytest_args
    files = test_files()
    if paths:
        roots = [(repo / p).resolve() for p in paths]
        files = [f for f in files if any((repo / f).resolve().is_relative_to(r) for r in roots)]
    return files, options


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Recorded seconds per test file, or ``{}`` when the file is missing or unreadable (shards then count files)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def shard(files: list[str], durations: dict[str, float], n: int) -> list[list[str]]:
    """``files`` in ``n`` groups of similar recorded time: longest first, each to the shard with the least so far."""
    known = sorted(durations[f] for f in files if f in durations)
    default = known[len(known) // 2] if known else 1.0
    weight = {f: durations.get(f, default) for f in files}
    shards: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for f in sorted(files, key=lambda f: (-weight[f], f)):
        i = min(range(n), key=lambda i: (load[i], i))
        shards[i].append(f)
        load[i] += weight[f]
    return [sorted(s) for s in shards if s]


def _pump(i: int, proc: subprocess.Popen[str], lock: threading.Lock, ended: dict[int, float]) -> None:
    """Copy shard ``i``'s output line by line, prefixed with its number; note when it ends."""
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{i}] {line}")
            sys.stdout.flush()
    ended[i] = time.monotonic()


def _report(xml: Path) -> ET.Element | None:
    """One shard's JUnit report, or None when pytest died before writing it."""
    try:
        return ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return None


def _totals(root: ET.Element | None) -> dict[str, float]:
    """Counts of one shard's JUnit report (zeros without a report)."""
    out = {"tests": 0.0, "failures": 0.0, "errors": 0.0, "skipped": 0.0}
    for suite in [] if root is None else root.iter("testsuite"):
        for k in out:
            out[k] += float(suite.get(k, 0) or 0)
    return out


def _file_times(root: ET.Element | None) -> dict[str, float]:
    """Seconds per test file (setup + call + teardown of its tests) from one shard's JUnit report."""
    times: dict[str, float] = {}
    for case in [] if root is None else root.iter("testcase"):
        mod = (case.get("classname") or "").split(".")
        # classname is the dotted module path (plus the class for tests in a class): find the test_*.py part
        for cut in range(len(mod), 0, -1):
            f = "/".join(mod[:cut]) + ".py"
            if (TESTS.parent / f).is_file():
                times[f] = times.get(f, 0.0) + float(case.get("time", 0) or 0)
                break
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="pytest processes to run side by side (default: cores, at most 2)")
    ap.add_argument("--record", action="store_true", help="rewrite tests/durations.json from this run")
    ap.add_argument("pytest_args", nargs="*", help="passed to every pytest process (put them after --)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"-j/--jobs must be at least 1, got {args.jobs}")
    files, options = select(args.pytest_args)
    groups = shard(files, load_durations(), args.jobs) if files else [[]]
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    lock = threading.Lock()
    start = time.monotonic()
    ended: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="neuron-compile-tests-") as tmp:
        procs, pumps, reports = [], [], []
        for i, group in enumerate(groups, 1):
            xml = Path(tmp) / f"shard{i}.xml"
            reports.append(xml)
            print(f"[{i}] {len(group)} files: {' '.join(group)}", flush=True)
            proc = subprocess.Popen([*base, f"--junitxml={xml}", *group], cwd=TESTS.parent, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
            procs.append(proc)
            pumps.append(threading.Thread(target=_pump, args=(i, proc, lock, ended), daemon=True))
            pumps[-1].start()
        codes = []
        try:
            for proc, pump in zip(procs, pumps, strict=True):
                codes.append(proc.wait())
                pump.join()
        finally:  # interrupted (Ctrl-C): no shard keeps running behind the user's back
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        wall = time.monotonic() - start
        parsed = [_report(x) for x in reports]
        totals = [_totals(r) for r in parsed]
        if args.record:
            times: dict[str, float] = {}
            for r in parsed:
                times.update(_file_times(r))
            DURATIONS.write_text(json.dumps({f: round(t, 1) for f, t in sorted(times.items())}, indent=1) + "\n")
    count = {k: int(sum(t[k] for t in totals)) for k in ("tests", "failures", "errors", "skipped")}
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    per = ", ".join(f"shard {i}: {ended.get(i, start + wall) - start:.0f} s, exit {c}" for i, c in enumerate(codes, 1))
    print(f"{passed} passed, {count['failures']} failed, {count['errors']} errors, {count['skipped']} skipped "
          f"in {wall:.0f} s ({per})", flush=True)
    bad = [c for c in codes if c not in (0, NO_TESTS)]
    if bad:
        return bad[0]
    return NO_TESTS if all(c == NO_TESTS for c in codes) else 0


if __name__ == "__main__":
    sys.exit(main())
