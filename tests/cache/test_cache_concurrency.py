"""Many real processes on one key: one compile; dead lock holders recovered; lock timeouts don't hang."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from cache_helpers import spawn_py, synthetic_key
from neuron_compile.cache import stats
from neuron_compile.cache.lock import KeyLock, LockTimeout, is_held, read_holder
from neuron_compile.cache.store import get_or_compile

from neuron_compile.config import config

_WORKER = """
import hashlib, json, os, sys, time
from neuron_compile.cache import get_or_compile
from neuron_compile.cache.key import CacheKey, digest_of
counter, start_at = sys.argv[1], float(sys.argv[2])
parts = {"schema": 1, "graph": {"sha256": "shared-graph"}}  # the manifest schema: graph is an object
key = CacheKey(digest_of(parts), parts)
def compile_fn():
    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"%d\\n" % os.getpid())
    os.close(fd)
    time.sleep(0.4)  # a slow compile: everyone else must be waiting on the lock meanwhile
    return {"plan.json": b'{"k": 1}', "kernels/k0.py": b"def k0(): pass\\n"}, {"kernels": ["k0"]}
while time.time() < start_at:  # start together
    time.sleep(0.001)
files, hit = get_or_compile(key, compile_fn)
blob = json.dumps({k: v.decode() for k, v in sorted(files.items())})
print(json.dumps({"hit": hit, "sha": hashlib.sha256(blob.encode()).hexdigest()}))
"""


def test_eight_processes_one_compile(tmp_path: Path) -> None:
    counter = tmp_path / "compiles.txt"
    env = {"NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache")}
    start_at = time.time() + 1.5
    procs = [spawn_py(_WORKER.replace("sys.argv[1], float(sys.argv[2])", f"{str(counter)!r}, {start_at!r}"),
                      env=env) for _ in range(8)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len(counter.read_text().splitlines()) == 1  # exactly one compile_fn call
    assert len({o["sha"] for o in outs}) == 1  # 8 identical results
    assert sorted(o["hit"] for o in outs) == [False] + [True] * 7
    totals = stats.read_stats(tmp_path / "cache")
    assert (totals["hits"], totals["misses"]) == (7, 1)
    assert os.listdir(tmp_path / "cache" / "locks") == []


_HOLDER = """
import sys, time
from pathlib import Path
from neuron_compile.cache.lock import KeyLock
lock = KeyLock(Path(sys.argv[1]))
lock.acquire(5)
Path(sys.argv[1] + ".ready").write_text("1")
time.sleep(60)
"""


def _hold(lock_path: Path) -> object:
    proc = spawn_py(_HOLDER.replace("sys.argv[1]", repr(str(lock_path))))
    deadline = time.time() + 30
    while not Path(str(lock_path) + ".ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.01)
    return proc


def _key_lock(cache_root: Path) -> Path:
    (cache_root / "locks").mkdir(parents=True, exist_ok=True)
    return cache_root / "locks" / f"{synthetic_key().digest}.lock"


def test_lock_of_killed_process_is_recovered(cache_root: Path) -> None:
    lock_path = _key_lock(cache_root)
    proc = _hold(lock_path)
    assert is_held(lock_path)
    holder = read_holder(lock_path)
    assert holder is not None and holder["pid"] == proc.pid  # type: ignore[attr-defined]
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    proc.wait()  # type: ignore[attr-defined]
    assert lock_path.exists() and not is_held(lock_path)  # the file is left behind, the lock is not
    calls = []
    t0 = time.monotonic()
    with config.patch(cache_lock_timeout=30.0):
        files, hit = get_or_compile(synthetic_key(), lambda: (calls.append(1) or {"plan.json": b"x"}, {}))
    assert time.monotonic() - t0 < 5.0 and (files, hit, calls) == ({"plan.json": b"x"}, False, [1])
    assert not lock_path.exists()


def test_stale_lock_file_with_dead_pid(cache_root: Path) -> None:
    lock_path = _key_lock(cache_root)
    lock_path.write_text(json.dumps({"pid": 999999, "host": "gone", "since": 0}))
    with config.patch(cache_lock_timeout=30.0):
        t0 = time.monotonic()
        assert get_or_compile(synthetic_key(), lambda: ({"plan.json": b"x"}, {})) == ({"plan.json": b"x"}, False)
    assert time.monotonic() - t0 < 5.0


def test_lock_timeout_compiles_without_waiting_forever(cache_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="neuron_compile.cache")
    lock_path = _key_lock(cache_root)
    proc = _hold(lock_path)
    try:
        calls = []
        t0 = time.monotonic()
        with config.patch(cache_lock_timeout=0.3):
            files, hit = get_or_compile(synthetic_key(), lambda: (calls.append(1) or {"plan.json": b"x"}, {}))
        waited = time.monotonic() - t0
        assert (files, hit, calls) == ({"plan.json": b"x"}, False, [1])
        assert 0.3 <= waited < 5.0
        (msg,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert f"for pid {proc.pid} on host" in msg and "compiling without waiting" in msg  # type: ignore[attr-defined]
        assert "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=0.3" in msg
        assert stats.read_stats(cache_root)["lock_timeouts"] == 1
        # Its result was still published (atomically), so the next process hits without the lock.
        assert get_or_compile(synthetic_key(), lambda: ({}, {})) == ({"plan.json": b"x"}, True)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        proc.wait()  # type: ignore[attr-defined]


def test_keylock_unit(tmp_path: Path) -> None:
    a, b = KeyLock(tmp_path / "k.lock"), KeyLock(tmp_path / "k.lock")
    a.acquire(1)
    with pytest.raises(LockTimeout, match=r"still held after 0\.\d s by pid \d+ on host"):
        b.acquire(0.05)
    a.release()
    assert not (tmp_path / "k.lock").exists()
    b.acquire(0.05)
    assert b.held
    b.release()
