"""Adversarial cases from issue 15: poisoning, symlinks, hangs and misleading messages, each with its outcome.

Every test damages a real cache (real compiled entries, real archives, real files, links and
mounts) and checks the exact outcome: refused and quarantined with a one-line reason, or handled
truthfully. A cache fault never changes a result and never stops a compile beyond its timeout.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from cache_helpers import ARTIFACTS, LIGHT_IMPORT, SUMMARY, run_py, synthetic_key
from neuron_compile.cache import stats
from neuron_compile.cache import store as store_mod
from neuron_compile.cache.store import CacheStore, get_or_compile

import neuron_compile.backend as B
from neuron_compile.cli import main
from neuron_compile.config import config
from neuron_compile.errors import ConfigError


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 3.0 + y, dim=-1)


def _compile_real_entries() -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Compile a small inference graph through the real backend: an ATen entry + a whole-graph entry."""
    torch._dynamo.reset()
    B.reset()
    args = (torch.randn(4, 40), torch.randn(4, 40))
    with torch.no_grad():
        out = torch.compile(_fn, backend="neuron", dynamic=False)(*args)
    torch.testing.assert_close(out, _fn(*args))
    return out, args


def _members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m, (tar.extractfile(m).read() if m.isfile() else b"")) for m in tar.getmembers()]  # type: ignore[union-attr]


def _write_archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _aten_digest(members: list[tuple[tarfile.TarInfo, bytes]]) -> str:
    """The archive's one ATen-graph entry (kind inference; the other is the whole Dynamo graph's)."""
    (name,) = [m.name for m, d in members if m.name.endswith("/manifest.json")
               and json.loads(d)["key_parts"]["kind"] == "inference"]
    return name.split("/")[1]


def _edit_kernel(members: list[tuple[tarfile.TarInfo, bytes]], digest: str) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Change a kernel's arithmetic and recompute the manifest's hashes and sizes: hashes alone can't tell."""
    out, edited = [], {}
    for m, d in members:
        if m.name.startswith(f"entries/{digest}/kernels/") and not edited:
            new = d.replace(b"3.0", b"4.0") if b"3.0" in d else d + b"\n# poisoned\n"
            assert new != d
            edited[m.name.split(f"{digest}/", 1)[1]] = new
            d = new
        out.append((m, d))
    for i, (m, d) in enumerate(out):
        if m.name == f"entries/{digest}/manifest.json":
            man = json.loads(d)
            for name, blob in edited.items():
                man["files"][name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            out[i] = (m, json.dumps(man).encode())
    return out


# ---------------------------------------------------------------------------------------------
# Poisoning


def test_import_verifies_by_recompiling(cache_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An honest archive imports (each ATen entry recompiled, byte-identical); the whole-graph entry
    is not imported (only re-tracing could verify it) and is reported as such; the import is a hit."""
    _compile_real_entries()
    archive = tmp_path / "honest.tgz"
    assert _run(capsys, "export", str(archive))[0] == 0
    other = tmp_path / "other"
    code, out, err = _run(capsys, "import", str(archive), "--cache-dir", str(other), "--json")
    res = json.loads(out)
    assert code == 0, err
    digest = _aten_digest(_members(archive))
    assert res["imported"] == [digest] and res["rejected"] == [] and res["verified"] is True
    # The whole-graph entry and the Dynamo package (warm frames, on by default) stay behind.
    assert sorted(u["reason"] for u in res["unverified"]) == [
        f"a {kind} entry can only be verified by re-tracing the model (the first run recreates it)"
        for kind in ("dynamo-frame", "dynamo-inference")]
    code, out, _ = _run(capsys, "verify", "--recompile", "--cache-dir", str(other))
    assert code == 0 and "1 entries checked, 1 ok, 0 bad, 0 not recompilable here" in out


def test_import_refuses_edited_kernel_with_recomputed_hashes(cache_root: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             warnings_log: pytest.LogCaptureFixture) -> None:
    """Issue 15: an archive whose kernel source is edited and whose manifest hashes are recomputed
    imported cleanly and returned wrong numbers. Now: refused and quarantined; --trust imports it."""
    _compile_real_entries()
    archive = tmp_path / "honest.tgz"
    _run(capsys, "export", str(archive))
    members = _members(archive)
    digest = _aten_digest(members)
    poisoned = tmp_path / "poisoned.tgz"
    _write_archive(poisoned, _edit_kernel(members, digest))
    other = tmp_path / "other"
    code, out, err = _run(capsys, "import", str(poisoned), "--cache-dir", str(other))
    assert code == 1 and "rejected 1" in out
    assert f"rejected {digest[:12]}: file 'kernels/" in err
    assert "differs from what this compiler generates for the stored graph (tampered?)" in err
    assert not (other / "entries" / digest).exists()
    (kept,) = [p for p in os.listdir(other / "quarantine") if p.startswith(digest)]
    (warning,) = [w for w in _warnings(warnings_log) if "refused imported entry" in w]
    assert f"refused imported entry {digest[:12]} (file 'kernels/" in warning and kept in warning
    # The hash-only verify can't see it once --trust lets it in; --recompile does.
    trusting = tmp_path / "trusting"
    code, _, err = _run(capsys, "import", "--trust", str(poisoned), "--cache-dir", str(trusting))
    assert code == 0 and "--trust: imported entries are NOT verified" in err
    assert _run(capsys, "verify", "--cache-dir", str(trusting))[0] == 0
    code, out, _ = _run(capsys, "verify", "--recompile", "--cache-dir", str(trusting))
    assert code == 1 and f"BAD  {digest[:12]}  file 'kernels/" in out


def test_import_refuses_a_graph_that_does_not_match_its_key(cache_root: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Editing the stored graph instead (so the kernels 'match' it) fails the key re-derivation."""
    _compile_real_entries()
    archive = tmp_path / "a.tgz"
    _run(capsys, "export", str(archive))
    members = _members(archive)
    digest = _aten_digest(members)
    out = []
    for m, d in members:
        if m.name == f"entries/{digest}/graph.json":
            d = d.replace(b'"args":{"tuple":[{"node":"arg0_1"},3.0]}', b'"args":{"tuple":[{"node":"arg0_1"},4.0]}')
        out.append((m, d))
    assert out != members
    man_i = next(i for i, (m, _) in enumerate(out) if m.name == f"entries/{digest}/manifest.json")
    graph = next(d for m, d in out if m.name == f"entries/{digest}/graph.json")
    man = json.loads(out[man_i][1])
    man["files"]["graph.json"] = {"size": len(graph), "sha256": hashlib.sha256(graph).hexdigest()}
    out[man_i] = (out[man_i][0], json.dumps(man).encode())
    bad = tmp_path / "bad.tgz"
    _write_archive(bad, out)
    code, _, err = _run(capsys, "import", str(bad), "--cache-dir", str(tmp_path / "o"))
    assert code == 1 and "its stored graph does not hash to the entry's key" in err


def test_import_never_extracts_unlisted_files(cache_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15: files not listed in a manifest were kept (512 MiB from a 0.5 MB archive). Now the entry
    is refused before anything is extracted."""
    key = synthetic_key()
    get_or_compile(key, lambda: (ARTIFACTS, SUMMARY))
    archive = tmp_path / "a.tgz"
    _run(capsys, "export", str(archive))
    members = _members(archive)
    bomb = tarfile.TarInfo(f"entries/{key.digest}/kernels/huge.bin")
    members.append((bomb, bytes(32 << 20)))  # 32 MiB of zeros: ~32 KiB compressed
    evil = tmp_path / "bomb.tgz"
    _write_archive(evil, members)
    assert evil.stat().st_size < 100_000
    other = tmp_path / "other"
    code, out, err = _run(capsys, "import", "--trust", str(evil), "--cache-dir", str(other))
    assert code == 1 and "file 'kernels/huge.bin' (33554432 bytes) is not listed in manifest.json" in err
    assert sum(f.stat().st_size for f in other.rglob("*") if f.is_file()) < 100_000


def test_manifest_must_list_exactly_the_files_present(cache_root: Path, capsys: pytest.CaptureFixture[str],
                                                      warnings_log: pytest.LogCaptureFixture) -> None:
    """An extra file, a manifest that omits plan.json, a symlinked file: verify catches each, a lookup
    quarantines it and recompiles (issue 15: the plan.json case crashed every compile with KeyError)."""
    cases = {}
    for tag in ("extra", "unlisted_plan", "no_plan", "symlink"):
        key = synthetic_key(tag)
        get_or_compile(key, lambda: (ARTIFACTS, SUMMARY))
        entry = cache_root / "entries" / key.digest
        man = json.loads((entry / "manifest.json").read_text())
        if tag == "extra":
            (entry / "kernels" / "evil.py").write_text("import os\n")
            reason = "file 'kernels/evil.py' (10 bytes) is not listed in manifest.json"
        elif tag in ("unlisted_plan", "no_plan"):
            del man["files"]["plan.json"]
            (entry / "manifest.json").write_text(json.dumps(man))
            if tag == "no_plan":
                (entry / "plan.json").unlink()
                reason = "manifest.json does not list 'plan.json', which a forward entry needs"
            else:
                reason = "manifest.json does not list 'plan.json', which a forward entry needs"
        else:
            target = cache_root.parent / "outside.py"
            target.write_bytes(ARTIFACTS["kernels/k0_add.py"])
            (entry / "kernels" / "k0_add.py").unlink()
            (entry / "kernels" / "k0_add.py").symlink_to(target)
            reason = "'kernels/k0_add.py' is a symbolic link; entries hold only plain files"
        cases[key.digest] = (key, reason)
    code, out, _ = _run(capsys, "verify", "--json")
    report = json.loads(out)
    assert code == 1 and report["checked"] == 4 and report["ok"] == 0
    assert {b["key"]: b["reason"] for b in report["bad"]} == {d: r for d, (_, r) in cases.items()}
    for key, reason in cases.values():
        calls: list[int] = []
        files, hit = get_or_compile(key, lambda calls=calls: (calls.append(1), (ARTIFACTS, SUMMARY))[1])
        assert (files, hit, calls) == (ARTIFACTS, False, [1])
        assert any(reason in w and "moved to" in w for w in _warnings(warnings_log))
    assert _run(capsys, "verify")[0] == 0


def test_unloadable_entry_is_quarantined_not_a_crash(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    """An entry whose hashes are fine but whose plan names a kernel it lacks (hand-made, manifest
    recomputed): the compile quarantines it and recompiles; results stay right."""
    _compile_real_entries()
    (digest,) = [d for d in os.listdir(cache_root / "entries")
                 if json.loads((cache_root / "entries" / d / "manifest.json").read_text())["key_parts"]["kind"] == "inference"]
    entry = cache_root / "entries" / digest
    plan = json.loads((entry / "plan.json").read_text())
    plan["kernel_names"].append("k99_missing")
    blob = json.dumps(plan).encode()
    (entry / "plan.json").write_bytes(blob)
    man = json.loads((entry / "manifest.json").read_text())
    man["files"]["plan.json"] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (entry / "manifest.json").write_text(json.dumps(man))
    for d in os.listdir(cache_root / "entries"):  # the whole-graph entry would serve the graph without it
        if d != digest:
            CacheStore(cache_root).remove(d)
    store_mod.reset_process_state()
    out, args = _compile_real_entries()
    torch.testing.assert_close(out, _fn(*args))
    assert any(f"entry {digest[:12]} is corrupt (its artifacts can't be loaded (KeyError" in w
               for w in _warnings(warnings_log))


# ---------------------------------------------------------------------------------------------
# Symlinks and permissions


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_planted_lock_file_never_touches_its_target(link: str, cache_root: Path, tmp_path: Path,
                                                    warnings_log: pytest.LogCaptureFixture) -> None:
    """Issue 15: a symlink at locks/<key>.lock made the compiler truncate and overwrite its target."""
    assert CacheStore.default() is not None
    key = synthetic_key()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious data\n")
    lock = cache_root / "locks" / f"{key.digest}.lock"
    if link == "symlink":
        lock.symlink_to(victim)
    else:
        os.link(victim, lock)
    files, hit = get_or_compile(key, lambda: (ARTIFACTS, SUMMARY))
    assert (files, hit) == (ARTIFACTS, False)
    assert victim.read_text() == "precious data\n"
    (warning,) = _warnings(warnings_log)
    expected = "it is a symbolic link" if link == "symlink" else "it has 2 hard links"
    assert f"refusing the lock file {lock} ({expected}); compiling without the lock" in warning
    assert get_or_compile(key, lambda: ({}, {})) == (ARTIFACTS, True)


@pytest.mark.parametrize("sub", ["locks", "tmp", "quarantine", "entries"])
@pytest.mark.parametrize("fault", ["symlink", "group_writable", "world_writable"])
def test_every_subfolder_is_checked(sub: str, fault: str, cache_root: Path, tmp_path: Path,
                                    warnings_log: pytest.LogCaptureFixture) -> None:
    """Issue 15: locks/, tmp/, quarantine/ were not checked for group/world write (or links)."""
    assert CacheStore.default() is not None
    store_mod.reset_process_state()
    path = cache_root / sub
    if fault == "symlink":
        os.rmdir(path)
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
        needle = f"{path} is a symbolic link"
    else:
        if fault == "group_writable":
            os.chown(path, os.geteuid(), 4242)
        path.chmod(0o770 if fault == "group_writable" else 0o777)
        needle = f"{path} is writable by other users"
    calls = []
    for _ in range(2):
        assert get_or_compile(synthetic_key(), lambda: (calls.append(1), (ARTIFACTS, SUMMARY))[1]) == (ARTIFACTS, False)
    assert len(calls) == 2 and os.listdir(tmp_path / "elsewhere" if fault == "symlink" else path) == []
    (warning,) = _warnings(warnings_log)
    assert warning.startswith("neuron-compile cache disabled: ") and needle in warning


# ---------------------------------------------------------------------------------------------
# Knobs and environment values


@pytest.mark.parametrize(("raw", "message"), [
    ("nan", "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=nan: expected a finite number in [0, 86400] (seconds)"),
    ("-1", "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=-1: expected a finite number in [0, 86400] (seconds)"),
    ("1e12", "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=1e12: expected a finite number in [0, 86400] (seconds)"),
    ("inf", "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=inf: expected a finite number in [0, 86400] (seconds)"),
    ("soon", "NEURON_COMPILE_CACHE_LOCK_TIMEOUT=soon: expected a number in [0, 86400] (seconds)"),
])
def test_lock_timeout_is_range_checked(raw: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE_LOCK_TIMEOUT", raw)
    with pytest.raises(ConfigError) as info:
        _ = config.cache_lock_timeout
    assert str(info.value) == message


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("cache_lock_timeout", float("nan"), "config.cache_lock_timeout=nan: expected a finite number in [0, 86400] (seconds)"),
    ("cache_lock_timeout", -5.0, "config.cache_lock_timeout=-5.0: expected a finite number in [0, 86400] (seconds)"),
    ("remote_cache_timeout", 0.0, "config.remote_cache_timeout=0.0: expected a finite number in [0.01, 600] (seconds)"),
    ("free_tile", 0, "config.free_tile=0: expected an integer in [1, 1048576]"),
    ("free_tile", -512, "config.free_tile=-512: expected an integer in [1, 1048576]"),
    ("row_resident_bytes", 1 << 40, "config.row_resident_bytes=1099511627776: expected an integer in [1, 16777216] (bytes)"),
])
def test_numeric_knobs_are_range_checked(knob: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info, config.patch(**{knob: value}):
        pass
    assert str(info.value) == message



def _bad_env_values(knob: object) -> list[str]:
    """Values each kind of knob must refuse: unparsable, nan/inf, negative, huge; a bad choice or boolean."""
    if knob.type is bool:  # type: ignore[attr-defined]
        return ["maybe", "2"]
    if knob.choices is not None:  # type: ignore[attr-defined]
        return ["nope"]
    if knob.type in (int, float):  # type: ignore[attr-defined]
        return ["abc", "nan", "inf", "-1", "1e30" if knob.type is float else "10000000000000"]  # type: ignore[attr-defined]
    return []


_ENV_CASES = [(k.env, raw) for k in config.knobs().values() if k.env for raw in _bad_env_values(k)]


def test_every_numeric_knob_has_a_range() -> None:
    unbounded = [k.name for k in config.knobs().values() if k.type in (int, float) and k.bounds is None]
    assert unbounded == []


@pytest.mark.parametrize(("env", "raw"), _ENV_CASES, ids=[f"{e}={r}" for e, r in _ENV_CASES])
def test_every_env_parse_error_is_one_line_naming_the_variable(env: str, raw: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each NEURON_COMPILE_* knob refuses a bad value with one line: VARIABLE=value: expected ..."""
    name = env.removeprefix("NEURON_COMPILE_").lower()
    monkeypatch.setenv(env, raw)
    with pytest.raises(ConfigError) as info:
        getattr(config, name)
    message = str(info.value)
    assert message.startswith(f"{env}={raw}: expected ") and "\n" not in message, message


_HELD_LOCK = LIGHT_IMPORT + """
import fcntl, os, sys, time
from neuron_compile.cache.store import CacheStore
from tests_key import key
store = CacheStore.default()
fd = os.open(store.root / "locks" / f"{key.digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_nan_lock_timeout_never_hangs_a_compile(cache_root: Path, tmp_path: Path) -> None:
    """Issue 15: NEURON_COMPILE_CACHE_LOCK_TIMEOUT=nan was accepted and a waiting compile never ended.
    Now the compile (another process holds the key's lock) warns once naming the variable and runs
    without the cache."""
    (tmp_path / "tests_key.py").write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom cache_helpers import synthetic_key\n"
                                          "key = synthetic_key()\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")},
           "NEURON_COMPILE_CACHE_DIR": str(cache_root), "PYTHONPATH": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-c", _HELD_LOCK], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = ("import logging\nlogging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
                "from tests_key import key\nfrom cache_helpers import ARTIFACTS, SUMMARY\n"
                "from neuron_compile.cache import get_or_compile\n"
                "print(get_or_compile(key, lambda: (ARTIFACTS, SUMMARY))[1])\n")
        t0 = time.monotonic()
        proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(cache_root), "PYTHONPATH": str(tmp_path),
                                 "NEURON_COMPILE_CACHE_LOCK_TIMEOUT": "nan"}, light=True, timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "False"
        warns = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
        assert warns == ["WARNING neuron-compile cache disabled: NEURON_COMPILE_CACHE_LOCK_TIMEOUT=nan: expected a "
                         "finite number in [0, 86400] (seconds)"], proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_bad_cache_env_value_is_one_line(cache_root: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: NEURON_COMPILE_CACHE=maybe gave a 20-line traceback. A compile now warns in one line and
    runs uncached; the CLI prints one error line and exits 1."""
    code = ("import logging, torch\nlogging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
            "import neuron_compile\nx = torch.randn(3, 5)\n"
            "with torch.no_grad():\n"
            "    out = torch.compile(lambda x: torch.relu(x) * 2, backend='neuron', dynamic=False)(x)\n"
            "torch.testing.assert_close(out, torch.relu(x) * 2)\nprint('ok')\n")
    proc = run_py(code, env={"NEURON_COMPILE_CACHE_DIR": str(cache_root), "NEURON_COMPILE_CACHE": "maybe"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    warns = [ln for ln in proc.stderr.splitlines() if "NEURON_COMPILE_CACHE=maybe" in ln]
    assert warns == ["WARNING neuron-compile cache disabled: NEURON_COMPILE_CACHE=maybe: expected a boolean "
                     "(1/0, true/false, yes/no, on/off)"], proc.stderr
    assert "Traceback" not in proc.stderr and not cache_root.exists()
    monkeypatch.setenv("NEURON_COMPILE_CACHE", "maybe")
    code_, out, err = _run(capsys, "stats")
    assert code_ == 1 and out == ""
    assert err == "error: NEURON_COMPILE_CACHE=maybe: expected a boolean (1/0, true/false, yes/no, on/off)\n"


# ---------------------------------------------------------------------------------------------
# Messages that used to mislead


def test_entry_path_that_is_a_file(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    """Issue 15: entries/<key> being a file gave "cannot write to <root> (Not a directory)" and stopped
    all caching. Now it is quarantined under its own name and the entry is published."""
    assert CacheStore.default() is not None
    key = synthetic_key()
    (cache_root / "entries" / key.digest).write_text("not a folder")
    assert get_or_compile(key, lambda: (ARTIFACTS, SUMMARY)) == (ARTIFACTS, False)
    (warning,) = _warnings(warnings_log)
    assert f"entry {key.digest[:12]} is corrupt (entries/<key> is a file, not a folder); moved to" in warning
    assert get_or_compile(key, lambda: ({}, {})) == (ARTIFACTS, True)
    other = synthetic_key("b")
    assert get_or_compile(other, lambda: (ARTIFACTS, SUMMARY)) == (ARTIFACTS, False)
    assert get_or_compile(other, lambda: ({}, {})) == (ARTIFACTS, True)  # writes still on


def _unshare_ok() -> bool:
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


def test_clear_on_read_only_root_says_so(cache_root: Path, tmp_path: Path) -> None:
    """Issue 15: `cache clear --yes` on a read-only root printed "Removed 0 entries (11.2 KiB)", exit 0."""
    if not _unshare_ok():
        pytest.skip("cannot make a private mount namespace here (unshare -m)")
    for tag in ("a", "b"):
        get_or_compile(synthetic_key(tag), lambda: (ARTIFACTS, SUMMARY))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")},
           "NEURON_COMPILE_CACHE_DIR": str(cache_root)}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro {cache_root} {cache_root} && '
                           'exec "$0" -m neuron_compile cache clear --yes', sys.executable],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Removed 0 entries (0 B)" in proc.stdout
    assert proc.stderr.strip() == (f"error: could not remove 2 of 2 entries from {cache_root} "
                                   "(Read-only file system)")
    assert len(os.listdir(cache_root / "entries")) == 2


_FULL_DISK = """
set -e
mount -t tmpfs -o size=256k tmpfs "$ROOT"
"$PY" -c "$POPULATE"
dd if=/dev/zero of="$ROOT/filler" bs=4k 2>/dev/null || true
"$PY" -c "$USE"
ls -a "$ROOT/cache/tmp"
"""


def test_full_disk_still_uses_valid_entries(tmp_path: Path) -> None:
    """Issue 15: on a full disk a new process ignored valid entries and leaked .probe-* files. On a real
    full tmpfs: the entry is a hit, a new graph compiles uncached with one warning, tmp/ stays empty."""
    if not _unshare_ok():
        pytest.skip("cannot make a private mount namespace here (unshare -m)")
    root = tmp_path / "mnt"
    root.mkdir()
    common = LIGHT_IMPORT + f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom cache_helpers import ARTIFACTS, SUMMARY, " \
        "synthetic_key\nfrom neuron_compile.cache import get_or_compile\n"
    populate = common + "print(get_or_compile(synthetic_key('old'), lambda: (ARTIFACTS, SUMMARY))[1])\n"
    use = common + ("import logging\nlogging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
                    "calls = []\n"
                    "print('old', get_or_compile(synthetic_key('old'), lambda: calls.append(1))[1])\n"
                    "print('new', get_or_compile(synthetic_key('new'), lambda: (calls.append(1), (ARTIFACTS, SUMMARY))[1])[1])\n"
                    "print('calls', len(calls))\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")},
           "NEURON_COMPILE_CACHE_DIR": str(root / "cache"), "ROOT": str(root), "PY": sys.executable,
           "POPULATE": populate, "USE": use}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", _FULL_DISK], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[:7] == ["False", "old", "True", "new", "False", "calls", "1"], proc.stdout
    assert [x for x in lines[7:] if x not in (".", "..")] == []  # no .probe-* left in tmp/
    warns = [ln for ln in proc.stderr.splitlines() if ln.startswith("WARNING")]
    assert len(warns) == 1 and "is not writable: No space left on device; using its existing entries" in warns[0]


def test_stats_count_whole_graph_hits(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15: `cache stats` didn't count whole-graph hits (a warm inference graph served without tracing)."""
    _compile_real_entries()
    store_mod.reset_process_state()
    _compile_real_entries()
    assert any(g.get("whole_graph") for g in B.compiled_graphs())
    totals = stats.read_stats(cache_root)
    assert totals["whole_graph_hits"] == 1 and totals["hits"] == 1
    code, out, _ = _run(capsys, "stats")
    assert code == 0 and "Whole-graph hits             1" in out


def test_cache_dir_option_anywhere(cache_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: --cache-dir worked only between `cache` and the verb. Now also after the verb and
    before `cache` (there it applies to every command, e.g. `neuron-compile --cache-dir D precompile ...`)."""
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(cache_root))  # restored after the test
    other = tmp_path / "other"
    store = CacheStore(other)
    assert store_mod.check_root(other, allow_shared=False) is None
    store.publish(synthetic_key(), ARTIFACTS, SUMMARY, 0.1)
    for argv in (["cache", "--cache-dir", str(other), "list", "--json"], ["cache", "list", "--cache-dir", str(other),
                 "--json"], ["cache", "list", "--json", "--cache-dir", str(other)],
                 ["--cache-dir", str(other), "cache", "list", "--json"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, err
        assert [e["key"] for e in json.loads(out)] == [synthetic_key().digest]
