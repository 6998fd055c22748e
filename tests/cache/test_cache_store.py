"""The store on real files: publish/lookup round trips and every fault injected on disk."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cache_helpers import ARTIFACTS, LIGHT_IMPORT, SUMMARY, run_py, synthetic_key
from neuron_compile.cache import stats
from neuron_compile.cache import store as store_mod
from neuron_compile.cache.store import CacheStore, get_or_compile

from neuron_compile.config import config


class Counter:
    """A compile_fn that counts its calls and returns the synthetic artifacts."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.calls = 0
        self.files = dict(files or ARTIFACTS)

    def __call__(self) -> tuple[dict[str, bytes], dict[str, object]]:
        self.calls += 1
        return dict(self.files), dict(SUMMARY)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_miss_then_hit_and_layout(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    key = synthetic_key()
    fn = Counter()
    files, hit = get_or_compile(key, fn)
    assert (files, hit, fn.calls) == (ARTIFACTS, False, 1)
    files, hit = get_or_compile(key, fn)
    assert (files, hit, fn.calls) == (ARTIFACTS, True, 1)
    entry = cache_root / "entries" / key.digest
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()) == [
        "kernels/k0_add.py", "manifest.json", "plan.json"]
    assert (cache_root / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["key"] == key.digest and manifest["key_parts"] == key.parts
    assert manifest["summary"] == SUMMARY and manifest["graph_text"] == key.graph_text
    assert manifest["files"]["plan.json"]["size"] == len(ARTIFACTS["plan.json"])
    assert manifest["total_bytes"] == sum(map(len, ARTIFACTS.values()))
    assert manifest["created"] <= manifest["last_used"]
    assert os.listdir(cache_root / "tmp") == [] and os.listdir(cache_root / "locks") == []
    totals = stats.read_stats(cache_root)
    assert (totals["hits"], totals["misses"], totals["bytes_written"]) == (1, 1, manifest["total_bytes"])
    assert _warnings(warnings_log) == []


def test_lookup_bumps_last_use(cache_root: Path) -> None:
    store = CacheStore.default()
    assert store is not None
    key = synthetic_key()
    store.publish(key, ARTIFACTS, SUMMARY, 1.5)
    manifest = store.entry_path(key.digest) / "manifest.json"
    os.utime(manifest, (1000.0, 1000.0))
    entry = store.lookup(key)
    assert entry is not None and entry.read("plan.json") == ARTIFACTS["plan.json"]
    assert manifest.stat().st_mtime > 1000.0
    with pytest.raises(KeyError, match="no file 'nope.py'; it has: kernels/k0_add.py, plan.json"):
        entry.read("nope.py")


def _corrupt(entry: Path, fault: str) -> str:
    """Damage a published entry for real; return the reason the warning must give."""
    if fault == "truncated":
        p = entry / "kernels/k0_add.py"
        p.write_bytes(p.read_bytes()[:5])
        return "'kernels/k0_add.py' is 5 bytes"
    if fault == "garbled":
        p = entry / "plan.json"
        data = bytearray(p.read_bytes())
        data[3] ^= 0xFF
        p.write_bytes(bytes(data))
        return "'plan.json' fails its content hash"
    if fault == "deleted_file":
        (entry / "plan.json").unlink()
        return "'plan.json' is missing"
    if fault == "missing_manifest":
        (entry / "manifest.json").unlink()
        return "manifest.json is missing"
    if fault == "garbage_manifest":
        (entry / "manifest.json").write_bytes(b"\x00\x17{not json")
        return "manifest.json is not valid JSON"
    if fault == "wrong_key_manifest":
        m = json.loads((entry / "manifest.json").read_text())
        m["key"] = "0" * 64
        (entry / "manifest.json").write_text(json.dumps(m))
        return "manifest.json names key 0000000000000000"
    raise AssertionError(fault)


@pytest.mark.parametrize("fault", ["truncated", "garbled", "deleted_file", "missing_manifest", "garbage_manifest",
                                   "wrong_key_manifest"])
def test_corrupt_entry_quarantined_and_recompiled(fault: str, cache_root: Path,
                                                  warnings_log: pytest.LogCaptureFixture) -> None:
    key = synthetic_key()
    fn = Counter()
    get_or_compile(key, fn)
    reason = _corrupt(cache_root / "entries" / key.digest, fault)
    files, hit = get_or_compile(key, fn)
    assert (files, hit, fn.calls) == (ARTIFACTS, False, 2)
    (warning,) = _warnings(warnings_log)
    assert f"entry {key.digest[:12]} is corrupt" in warning and reason in warning and "quarantine" in warning
    (moved,) = os.listdir(cache_root / "quarantine")
    assert moved.startswith(key.digest)
    # The recompiled entry was published again and is good.
    assert get_or_compile(key, fn) == (ARTIFACTS, True) and fn.calls == 2
    assert stats.read_stats(cache_root)["corrupt"] == 1


def test_compile_fn_exception_propagates_and_releases_lock(cache_root: Path) -> None:
    key = synthetic_key()
    err = RuntimeError("lowering exploded")

    def boom() -> tuple[dict[str, bytes], dict[str, object]]:
        raise err

    with pytest.raises(RuntimeError) as info:
        get_or_compile(key, boom)
    assert info.value is err
    assert os.listdir(cache_root / "locks") == [] and not (cache_root / "entries" / key.digest).exists()
    with config.patch(cache_lock_timeout=0.5):
        assert get_or_compile(key, Counter()) == (ARTIFACTS, False)


def test_bad_artifact_names_not_cached(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    fn = Counter({"../escape.py": b"x"})
    assert get_or_compile(synthetic_key(), fn) == ({"../escape.py": b"x"}, False)
    assert "artifact name '../escape.py'" in _warnings(warnings_log)[0]
    assert os.listdir(cache_root / "entries") == []


def test_disabled_by_env(cache_root: Path, monkeypatch: pytest.MonkeyPatch,
                         warnings_log: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE", "0")
    fn = Counter()
    assert get_or_compile(synthetic_key(), fn) == (ARTIFACTS, False)
    assert get_or_compile(synthetic_key(), fn) == (ARTIFACTS, False)
    assert fn.calls == 2 and not cache_root.exists() and _warnings(warnings_log) == []


def test_default_root_xdg_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURON_COMPILE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store_mod.default_root() == tmp_path / "xdg" / "neuron-compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store_mod.default_root() == tmp_path / "home" / ".cache" / "neuron-compile"


def _check_degrades(warnings_log: pytest.LogCaptureFixture, needle: str) -> None:
    fn = Counter()
    for _ in range(3):
        assert get_or_compile(synthetic_key(), fn) == (ARTIFACTS, False)
    assert fn.calls == 3
    warns = _warnings(warnings_log)
    assert len(warns) == 1, warns  # one warning per process
    assert warns[0].startswith("neuron-compile cache disabled: ") and needle in warns[0]


def test_file_where_directory_should_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_root: Path,
                                        warnings_log: pytest.LogCaptureFixture) -> None:
    (tmp_path / "afile").write_text("I am a file")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    _check_degrades(warnings_log, "cannot create the cache directory")


def test_root_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_root: Path,
                        warnings_log: pytest.LogCaptureFixture) -> None:
    (tmp_path / "afile").write_text("I am a file")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "afile"))
    _check_degrades(warnings_log, "afile")


def test_world_writable_root_refused_unless_allowed(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    cache_root.mkdir()
    cache_root.chmod(0o777)
    _check_degrades(warnings_log, "is writable by other users (mode drwxrwxrwx)")
    assert "NEURON_COMPILE_CACHE_ALLOW_SHARED=1" in _warnings(warnings_log)[0]
    assert "chmod go-w" in _warnings(warnings_log)[0]
    store_mod.reset_process_state()
    with config.patch(cache_allow_shared=True):
        fn = Counter()
        get_or_compile(synthetic_key(), fn)
        assert get_or_compile(synthetic_key(), fn) == (ARTIFACTS, True) and fn.calls == 1


def test_foreign_owner_refused(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    cache_root.mkdir()
    os.chown(cache_root, 4242, 4242)
    _check_degrades(warnings_log, "is owned by uid 4242, not by you")


def test_group_writable_root_refused(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    cache_root.mkdir()
    os.chown(cache_root, os.geteuid(), 4242)  # a group that is not the user's private group
    cache_root.chmod(0o770)
    _check_degrades(warnings_log, "writable by other users")


_RO_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from neuron_compile.cache import get_or_compile
from neuron_compile.cache.key import CacheKey, digest_of
parts = {"schema": 1, "g": sys.argv[1] if len(sys.argv) > 1 else "x"}
key = CacheKey(digest_of(parts), parts)
calls = []
def fn():
    calls.append(1)
    return {"plan.json": b"x" * 20000}, {}
for _ in range(3):
    files, hit = get_or_compile(key, fn)
    assert files == {"plan.json": b"x" * 20000} and not hit
print("calls", len(calls))
"""


def test_read_only_mount(tmp_path: Path) -> None:
    """A real read-only bind mount (private mount namespace): one warning, compiles without caching."""
    root = tmp_path / "ro"
    root.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {root} {root}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {probe.stderr!r}")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount --bind -o ro {root} {root} && exec "$0" -c "$1"', sys.executable,
         LIGHT_IMPORT + _RO_SCRIPT], env={**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE")},
                       "NEURON_COMPILE_CACHE_DIR": str(root)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "calls 3"
    warns = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
    assert len(warns) == 1 and "Read-only file system" in warns[0], proc.stderr


def test_full_disk_degrades_with_one_warning(tmp_path: Path) -> None:
    """A real write failure (EFBIG from RLIMIT_FSIZE, as a full disk would give ENOSPC) while publishing."""
    code = ("import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n" + _RO_SCRIPT)
    proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(tmp_path / "c")}, light=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "calls 3"
    warns = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
    assert len(warns) == 1 and "cannot write to" in warns[0] and "File too large" in warns[0], proc.stderr
    assert os.listdir(tmp_path / "c" / "entries") == [] and os.listdir(tmp_path / "c" / "tmp") == []


def test_publish_race_keeps_first_entry(cache_root: Path) -> None:
    store = CacheStore.default()
    assert store is not None
    key = synthetic_key()
    first = store.publish(key, ARTIFACTS, SUMMARY, 1.0)
    second = store.publish(key, {"plan.json": b"other"}, SUMMARY, 1.0)
    assert first is not None and second is not None
    assert store.lookup(key).read("plan.json") == ARTIFACTS["plan.json"]  # type: ignore[union-attr]
    assert os.listdir(cache_root / "tmp") == []


def test_private_mode_of_new_root(cache_root: Path) -> None:
    assert CacheStore.default() is not None
    assert stat.S_IMODE(cache_root.stat().st_mode) == 0o700
