"""``neuron-compile cache``: every verb, its ``--json`` output and its error exits, on real cache folders."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from cache_helpers import ARTIFACTS, SUMMARY, synthetic_key
from neuron_compile.cache.key import CacheKey, compute_key
from neuron_compile.cache.store import CacheStore, check_root, get_or_compile
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.cli import main


def _real_key(rows: int) -> CacheKey:
    x = torch.randn(rows, 3)
    gm = make_fx(lambda x: torch.softmax(x * 2, dim=-1))(x)
    return compute_key(gm, [x], kind="inference")


def _store(root: Path) -> CacheStore:
    assert check_root(root, allow_shared=False) is None
    return CacheStore(root)


@pytest.fixture
def two(cache_root: Path) -> tuple[CacheKey, CacheKey]:
    """Two real entries (shapes 2x3 and 4x3) published through get_or_compile."""
    k1, k2 = _real_key(2), _real_key(4)
    get_or_compile(k1, lambda: (ARTIFACTS, SUMMARY))
    get_or_compile(k2, lambda: ({**ARTIFACTS, "kernels/k1_big.py": b"x" * 5000}, {"kernels": ["k0_add", "k1_big"]}))
    get_or_compile(k1, lambda: ({}, {}))  # a hit
    return k1, k2


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_path(cache_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(capsys, "path") == (0, f"{cache_root}\n", "")
    monkeypatch.setenv("NEURON_COMPILE_CACHE", "0")
    code, out, err = _run(capsys, "path")
    assert (code, out) == (0, f"{cache_root}\n") and "disabled (NEURON_COMPILE_CACHE=0)" in err
    assert _run(capsys, "--cache-dir", "/x/y", "path")[1] == "/x/y\n"


def test_missing_cache_is_graceful(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "list") == (0, f"No cache entries in {cache_root}\n", "")
    assert _json(capsys, "list") == []
    st = _json(capsys, "stats")
    assert (st["entries"], st["hits"], st["misses"], st["size_bytes"], st["hit_rate"]) == (0, 0, 0, 0, None)
    assert _json(capsys, "verify") == {"checked": 0, "ok": 0, "bad": []}
    assert _run(capsys, "clear")[0:2] == (0, f"No cache at {cache_root}: nothing to clear\n")
    assert _json(capsys, "prune", "--max-size", "1M")["removed"] == []
    code, _, err = _run(capsys, "show", "abc")
    assert code == 1 and f"no cache entry matches key prefix 'abc' in {cache_root}" in err
    assert not cache_root.exists()  # read-only verbs never create it


def test_list(two: tuple[CacheKey, CacheKey], cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    k1, k2 = two
    code, out, _ = _run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "KIND", "GRAPH", "INPUTS", "KERNELS", "SIZE", "LAST", "USED"]
    assert lines[1].startswith(k1.digest[:12])  # most recently used first (k1 was just hit)
    assert "f32[2,3]" in lines[1] and "inference" in lines[1] and "1: k0_add" in lines[1]
    assert "f32[4,3]" in lines[2] and "2: k0_add, k1_big" in lines[2]
    assert lines[-1].startswith("2 entries, ") and str(cache_root) in lines[-1]
    rows = _json(capsys, "list", "--sort", "size")
    assert [r["key"] for r in rows] == [k2.digest, k1.digest]
    r = rows[1]
    assert r["inputs"] == ["f32[2,3]"] and r["kernels"] == ["k0_add"] and r["kind"] == "inference"
    assert r["graph"]["ops"] == k1.parts["graph"]["ops"] and r["valid"] is True  # type: ignore[index]
    assert r["size"] > sum(map(len, ARTIFACTS.values())) and r["files"] == 2
    assert r["created"] <= r["last_used"] <= time.time()
    assert [x["key"] for x in _json(capsys, "list", "--sort", "created")] == [k2.digest, k1.digest]
    code, _, err = _run(capsys, "list", "--sort", "name")
    assert code == 2 and "invalid choice: 'name'" in err


def test_show(two: tuple[CacheKey, CacheKey], capsys: pytest.CaptureFixture[str]) -> None:
    k1, _ = two
    code, out, _ = _run(capsys, "show", k1.digest[:8])
    assert code == 0
    assert f"key:          {k1.digest}" in out and "integrity:    OK" in out and "inputs:       f32[2,3]" in out
    assert "inputs[0].shape" in out and "codegen.fuse" in out and "kernels/k0_add.py" in out
    assert "def k0_add" not in out
    code, out, _ = _run(capsys, "show", k1.digest[:8].upper(), "--source")
    assert code == 0 and "# ==> kernels/k0_add.py <==\ndef k0_add(a, b):\n    return a + b" in out
    data = _json(capsys, "show", k1.digest[:10], "--source")
    assert data["key"] == k1.digest and data["key_parts"] == k1.parts and data["valid"] is True
    assert data["sources"]["kernels/k0_add.py"] == ARTIFACTS["kernels/k0_add.py"].decode()
    assert set(data["files"]) == set(ARTIFACTS) and data["summary"] == SUMMARY


def test_show_errors(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(cache_root)
    keys = [synthetic_key(str(i)) for i in range(17)]  # 17 keys over 16 first digits: some share one
    for k in keys:
        store.publish(k, ARTIFACTS, SUMMARY, 0.1)
    firsts = [k.digest[0] for k in keys]
    shared = next(c for c in firsts if firsts.count(c) > 1)
    code, _, err = _run(capsys, "show", shared)
    assert code == 1 and f"key prefix '{shared}' is ambiguous: it matches {firsts.count(shared)} entries" in err
    assert "give more digits" in err
    code, _, err = _run(capsys, "show", "xyz!")
    assert code == 1 and "'xyz!' is not a key prefix" in err
    code, _, err = _run(capsys, "show")
    assert code == 2 and "required: KEY_PREFIX" in err


def test_stats_and_zero(two: tuple[CacheKey, CacheKey], cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = _json(capsys, "stats")
    assert (st["entries"], st["hits"], st["misses"], st["hit_rate"]) == (2, 1, 2, pytest.approx(1 / 3))
    assert st["cache_dir"] == str(cache_root) and st["size_bytes"] > 5000 and st["bytes_written"] > 5000
    assert st["compile_seconds_saved"] >= 0 and st["since"] is not None and st["enabled"] is True
    code, out, _ = _run(capsys, "stats")
    assert code == 0 and "Hits                         1 (33.3%)" in out and "Misses                       2" in out
    assert _run(capsys, "stats", "--zero")[:2] == (0, "Statistics zeroed\n")
    st = _json(capsys, "stats")
    assert (st["hits"], st["misses"], st["entries"]) == (0, 0, 2)


def test_verify_and_quarantine(two: tuple[CacheKey, CacheKey], cache_root: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    k1, k2 = two
    assert _run(capsys, "verify")[:2] == (0, "2 entries checked, 2 ok, 0 bad\n")
    (cache_root / "entries" / k2.digest / "kernels" / "k1_big.py").write_bytes(b"y" * 5000)
    code, out, err = _run(capsys, "verify")
    assert code == 1 and f"BAD  {k2.digest[:12]}  file 'kernels/k1_big.py' fails its content hash" in out
    assert "verify --quarantine" in err
    code, out, _ = _run(capsys, "verify", "--json")
    data = json.loads(out)
    assert code == 1 and data["checked"] == 2 and data["ok"] == 1 and data["bad"][0]["key"] == k2.digest
    code, out, _ = _run(capsys, "verify", "--quarantine")
    assert code == 0 and "1 quarantined" in out
    assert not (cache_root / "entries" / k2.digest).exists() and len(os.listdir(cache_root / "quarantine")) == 1
    assert _run(capsys, "verify")[:2] == (0, "1 entries checked, 1 ok, 0 bad\n")


def test_prune(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(cache_root)
    now = time.time()
    keys = [synthetic_key(f"p{i}") for i in range(4)]
    for i, k in enumerate(keys):
        store.publish(k, {"plan.json": bytes(10_000)}, SUMMARY, 1.0)
        t = now - (4 - i) * 86400  # keys[0] least recently used (4 days), keys[3] 1 day
        os.utime(store.entry_path(k.digest) / "manifest.json", (t, t))
    dry = _json(capsys, "prune", "--older-than", "2.5d", "--dry-run")
    assert dry["removed"] == [keys[0].digest, keys[1].digest] and dry["dry_run"] is True
    assert len(store.digests()) == 4
    res = _json(capsys, "prune", "--older-than", "60h")
    assert res["removed"] == [keys[0].digest, keys[1].digest] and res["kept"] == 2
    assert store.digests() == sorted([keys[2].digest, keys[3].digest])
    size_one = res["kept_bytes"] // 2
    code, out, _ = _run(capsys, "prune", "--max-size", f"{size_one + 100}B")
    assert code == 0 and f"Removed {keys[2].digest[:12]}" in out and "1 entries" in out
    assert store.digests() == [keys[3].digest]
    code, _, err = _run(capsys, "prune", "--max-size", "12Q")
    assert code == 2 and "invalid size '12Q'" in err
    code, _, err = _run(capsys, "prune", "--older-than", "soon")
    assert code == 2 and "invalid age 'soon'" in err
    code, _, err = _run(capsys, "prune")
    assert code == 2 and "prune needs --max-size SIZE and/or --older-than AGE" in err


def test_clear(two: tuple[CacheKey, CacheKey], cache_root: Path, capsys: pytest.CaptureFixture[str],
               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = _run(capsys, "clear")
    assert code == 1 and f"refusing to clear 2 entries in {cache_root} without confirmation: pass --yes" in err
    assert len(os.listdir(cache_root / "entries")) == 2
    res = _json(capsys, "clear", "--yes")
    assert res["removed"] == 2 and res["freed_bytes"] > 5000
    assert _json(capsys, "list") == [] and _json(capsys, "stats")["hits"] == 1  # stats survive a clear


def test_diff(two: tuple[CacheKey, CacheKey], capsys: pytest.CaptureFixture[str]) -> None:
    k1, k2 = two
    code, out, _ = _run(capsys, "diff", k1.digest[:8], k2.digest[:8])
    assert code == 0 and f"key part(s) differ between a={k1.digest[:12]} and b={k2.digest[:12]}" in out
    (row,) = [ln for ln in out.splitlines() if ln.startswith("inputs[0].shape")]
    assert row.split() == ["inputs[0].shape", "[2,", "3]", "[4,", "3]"]
    assert "canonical graph diff:" in out and '"shape":[4,3]' in out
    data = _json(capsys, "diff", k1.digest[:8], k2.digest[:8])
    diffs = {d["part"]: (d["a"], d["b"]) for d in data["differences"]}
    assert diffs["inputs[0].shape"] == ([2, 3], [4, 3])
    assert set(diffs) == {"inputs[0].shape", "graph.sha256"}  # stride [3,1] is the same for both
    assert data["identical"] is False and any(line.startswith("+n") for line in data["graph_diff"])
    same = _json(capsys, "diff", k1.digest[:8], k1.digest)
    assert same["identical"] is True and same["differences"] == []
    code, _, err = _run(capsys, "diff", k1.digest[:8])
    assert code == 2 and "KEY_B" in err


def test_diff_explains_knob_change(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from neuron_compile.config import config

    k1 = _real_key(2)
    with config.patch(fuse=False, target="trn1"):
        k2 = _real_key(2)
    for k in (k1, k2):
        get_or_compile(k, lambda: (ARTIFACTS, SUMMARY))
    data = _json(capsys, "diff", k1.digest, k2.digest)
    assert {d["part"]: (d["a"], d["b"]) for d in data["differences"]} == {
        "codegen.fuse": (True, False), "codegen.target": ("trn2", "trn1"), "target": ("trn2", "trn1")}
    assert data["graph_diff"] == []


def _archive_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _entry_members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    out = []
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out.append((m, f.read() if f else b""))
    return out


def test_export_import_roundtrip(two: tuple[CacheKey, CacheKey], tmp_path: Path, cache_root: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "warm.tar.gz"
    res = _json(capsys, "export", str(archive))
    assert sorted(res["exported"]) == sorted(k.digest for k in two) and res["skipped"] == []
    other = tmp_path / "other"
    # Synthetic artifacts can't be verified by recompiling: without --trust nothing is imported.
    res = _json(capsys, "--cache-dir", str(other), "import", str(archive))
    assert res["imported"] == [] and res["rejected"] == [] and res["verified"] is True
    assert {u["reason"] for u in res["unverified"]} == {"it does not store the graph it was compiled from"}
    code, out, err = _run(capsys, "import", "--trust", str(archive), "--cache-dir", str(other), "--json")
    res = json.loads(out)
    assert code == 0 and sorted(res["imported"]) == sorted(k.digest for k in two) and res["rejected"] == []
    assert res["verified"] is False and "WARNING: --trust: imported entries are NOT verified" in err
    assert _run(capsys, "--cache-dir", str(other), "verify")[0] == 0
    code, out, _ = _run(capsys, "--cache-dir", str(other), "import", "--trust", str(archive))
    assert code == 0 and "Imported 0 entries, skipped 2 already present, rejected 0" in out
    # An imported entry is a hit for the same key.
    assert CacheStore(other).get_or_compile(two[0], lambda: ({}, {})) == (ARTIFACTS, True)
    # Export of a chosen prefix only.
    one = tmp_path / "one.tgz"
    assert _json(capsys, "export", str(one), two[1].digest[:9])["exported"] == [two[1].digest]


def test_import_rejects_tampered_and_forged(two: tuple[CacheKey, CacheKey], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "warm.tar.gz"
    _json(capsys, "export", str(archive), two[0].digest[:12])
    members = _entry_members(archive)
    # Garbled artifact bytes.
    bad = tmp_path / "garbled.tgz"
    _archive_with(bad, [(m, d.replace(b"return", b"RETURN") if m.name.endswith(".py") else d) for m, d in members])
    code, out, err = _run(capsys, "--cache-dir", str(tmp_path / "c1"), "import", str(bad))
    assert code == 1 and "fails its content hash" in err and "rejected 1" in out
    assert os.listdir(tmp_path / "c1" / "entries") == []
    # Forged key parts with consistent file hashes: the digest no longer derives from the parts.
    forged = tmp_path / "forged.tgz"
    out_members = []
    for m, d in members:
        if m.name.endswith("manifest.json"):
            man = json.loads(d)
            man["key_parts"]["target"] = "trn3"
            d = json.dumps(man).encode()
        out_members.append((m, d))
    _archive_with(forged, out_members)
    code, _, err = _run(capsys, "--cache-dir", str(tmp_path / "c2"), "import", str(forged))
    assert code == 1 and "key parts hash to" in err


@pytest.mark.parametrize("evil", ["traversal", "absolute", "symlink", "outside", "upper_case_key"])
def test_import_refuses_unsafe_archives(evil: str, tmp_path: Path, cache_root: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    digest = synthetic_key().digest
    good = (tarfile.TarInfo(f"entries/{digest}/plan.json"), b"{}")
    if evil == "traversal":
        bad = (tarfile.TarInfo(f"entries/{digest}/../../../escape.txt"), b"pwned")
    elif evil == "absolute":
        bad = (tarfile.TarInfo("/tmp/escape.txt"), b"pwned")
    elif evil == "outside":
        bad = (tarfile.TarInfo("escape.txt"), b"pwned")
    elif evil == "upper_case_key":
        bad = (tarfile.TarInfo(f"entries/{digest.upper()}/plan.json"), b"{}")
    else:
        info = tarfile.TarInfo(f"entries/{digest}/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        bad = (info, None)  # type: ignore[assignment]
    archive = tmp_path / "evil.tgz"
    _archive_with(archive, [good, bad])  # type: ignore[list-item]
    code, out, err = _run(capsys, "import", str(archive))
    assert code == 1 and f"refusing {archive}: member" in err and "nothing imported" in err
    expected = {"symlink": "link or special file",
                "outside": "'escape.txt' is not entries/<key>/<file> (a key is 64 lower-case hex digits)",
                "upper_case_key": "is not entries/<key>/<file> (a key is 64 lower-case hex digits); is this a "
                                  "neuron-compile cache export?"}.get(evil, "outside entries/<key>/ or escapes it")
    assert expected in err
    assert not (tmp_path / "escape.txt").exists() and _run(capsys, "list", "--json")[1].strip() == "[]"


def test_import_refuses_an_entry_with_a_file_twice(two: tuple[CacheKey, CacheKey], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """tar keeps both copies of a repeated member (and readers differ on which wins): the entry is refused by name,
    the rest of the archive still imports."""
    archive = tmp_path / "warm.tar.gz"
    _json(capsys, "export", str(archive))
    members = _entry_members(archive)
    twice = next(m for m, _ in members if m.name.startswith(f"entries/{two[0].digest}/") and m.name.endswith(".py"))
    doubled = tmp_path / "doubled.tgz"
    _archive_with(doubled, members + [(twice, b"print('the other copy')\n")])
    code, out, err = _run(capsys, "--cache-dir", str(tmp_path / "c1"), "import", "--trust", str(doubled))
    rel = twice.name.split("/", 2)[2]
    assert code == 1 and f"file {rel!r} appears more than once in the archive" in err
    assert "Imported 1 entries" in out and "rejected 1" in out
    assert os.listdir(tmp_path / "c1" / "entries") == [two[1].digest]


def test_import_errors(tmp_path: Path, cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "import", str(tmp_path / "nope.tgz"))
    assert code == 1 and "nope.tgz: no such file" in err
    junk = tmp_path / "junk.tgz"
    junk.write_bytes(b"this is not a tarball")
    code, _, err = _run(capsys, "import", str(junk))
    assert code == 1 and "cannot read" in err
    code, _, err = _run(capsys, "export", str(tmp_path / "missing-dir" / "x.tgz"))
    assert code == 1 and "cannot write" in err


def test_usage_errors(cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys)
    assert code == 2 and "a VERB is required" in err
    code, _, err = _run(capsys, "frobnicate")
    assert code == 2 and "invalid choice: 'frobnicate'" in err
    code, _, err = _run(capsys, "stats", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err


def test_console_script_and_python_m(two: tuple[CacheKey, CacheKey], cache_root: Path) -> None:
    env = {"NEURON_COMPILE_CACHE_DIR": str(cache_root)}
    full_env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}, **env}
    exe = Path(sys.executable).with_name("neuron-compile")
    # The console script when installed here, else the same entry through `python -m`.
    cmds = [[str(exe)] if exe.exists() else [sys.executable, "-m", "neuron_compile"]]
    for cmd in [[*c, "cache", "list", "--json"] for c in cmds]:
        res = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert sorted(e["key"] for e in json.loads(res.stdout)) == sorted(k.digest for k in two)
    res = subprocess.run([sys.executable, "-m", "neuron_compile", "cache", "show", "zz"], env=full_env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "not a key prefix" in res.stderr
