"""The command line on bad input: damaged cache entries, a root that can't be written, odd paths and settings.

Every case ends in one ``error: ...`` line on stderr and exit 1 (runtime) or 2 (usage), or in the entry being
reported as unreadable/corrupt; never a traceback, and ``--json`` output stays strict JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cache_helpers import ARTIFACTS, SUMMARY, synthetic_key
from neuron_compile.cache.store import CacheStore, check_root

from neuron_compile.cli import main

Capsys = pytest.CaptureFixture[str]


def _run(capsys: Capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    return code, out, err


def _cache(capsys: Capsys, *argv: str) -> tuple[int, str, str]:
    return _run(capsys, "cache", *argv)


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def entries(cache_root: Path) -> tuple[str, str]:
    """Two synthetic entries: (the one the tests damage, a healthy one)."""
    assert check_root(cache_root, allow_shared=False) is None
    store = CacheStore(cache_root)
    keys = [synthetic_key("victim"), synthetic_key("healthy")]
    for k in keys:
        assert store.publish(k, ARTIFACTS, SUMMARY, 0.25) is not None
    return keys[0].digest, keys[1].digest


def _edit_manifest(root: Path, digest: str, edit: Callable[[dict[str, Any]], None]) -> None:
    path = root / "entries" / digest / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))  # NaN is written as NaN, as a careless editor would


def _set(*where: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        target = m
        for step in where[:-1]:
            target = target[step] if not step.isdigit() else target[int(step)]
        target[where[-1]] = value
    return edit


# -- 1. manifests with unexpected field types ---------------------------------------------------------------


BAD_FIELDS = {
    "inputs-number": (_set("key_parts", "inputs", value=5), "key part 'inputs' is a number, expected a list"),
    "input-shape-number": (_set("key_parts", "inputs", "0", "shape", value=5), "'inputs[0].shape' is a number"),
    "ops-list": (_set("key_parts", "graph", "ops", value=[1]), "key part 'graph.ops' is a list"),
    "ops-count-string": (_set("key_parts", "graph", "ops", value={"aten.add.Tensor": "x"}), "expected an integer"),
    "graph-string": (_set("key_parts", "graph", value="g"), "key part 'graph' is a string"),
    "created-nan": (_set("created", value=float("nan")), "impossible 'created' time (nan)"),
    "created-huge": (_set("created", value=1e300), "impossible 'created' time (1e+300)"),
    "created-negative": (_set("created", value=-1e20), "impossible 'created' time (-1e+20)"),
    "created-bool": (_set("created", value=True), "lacks a valid 'created' field"),
    "summary-list": (_set("summary", value=[1]), "'summary' is a list, expected an object"),
    "graph-text-number": (_set("graph_text", value=5), "'graph_text' is a number, expected a string"),
    "deeply-nested": (lambda m: None, "nested too deeply to read"),  # replaced by raw text below
    "nested-past-limit": (_set("summary", "deep", value=json.loads("[" * 80 + "]" * 80)), "nested more than 64"),
}


def _damage(root: Path, digest: str, case: str) -> None:
    if case == "deeply-nested":  # valid JSON the parser can't descend: RecursionError before the fix
        (root / "entries" / digest / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    else:
        _edit_manifest(root, digest, BAD_FIELDS[case][0])


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_manifest_with_bad_field_is_an_unreadable_entry(case: str, entries: tuple[str, str], cache_root: Path,
                                                        tmp_path: Path, capsys: Capsys) -> None:
    victim, healthy = entries
    reason = BAD_FIELDS[case][1]
    _damage(cache_root, victim, case)

    code, out, _ = _cache(capsys, "list")
    (row,) = [ln for ln in out.splitlines() if ln.startswith(victim[:12])]
    assert code == 0 and row.split()[1] == "?" and "(unreadable: manifest.json" in row
    assert any(ln.startswith(healthy[:12]) and "forward" in ln for ln in out.splitlines())
    code, out, _ = _cache(capsys, "list", "--json")
    infos = {i["key"]: i for i in _strict_json(out)}
    assert code == 0 and infos[victim]["valid"] is False and reason in infos[victim]["problem"]
    assert infos[healthy]["valid"] is True

    code, out, _ = _cache(capsys, "stats", "--json")
    assert code == 0 and _strict_json(out)["entries"] == 2
    assert _cache(capsys, "stats")[0] == 0
    code, out, _ = _cache(capsys, "prune", "--max-size", "0", "--dry-run", "--json")
    assert code == 0 and sorted(_strict_json(out)["removed"]) == sorted(entries)

    code, out, err = _cache(capsys, "show", victim[:8])
    assert (code, out) == (1, "") and f"error: entry {victim[:12]} is corrupt (" in err and reason in err
    assert "verify --quarantine" in err
    code, _, err = _cache(capsys, "diff", victim[:8], healthy[:8])
    assert code == 1 and f"error: entry {victim[:12]} is corrupt" in err and reason in err

    code, out, _ = _cache(capsys, "export", str(tmp_path / "a.tgz"), "--json")
    res = _strict_json(out)
    assert code == 0 and res["exported"] == [healthy] and res["skipped"][0]["key"] == victim

    code, out, _ = _cache(capsys, "verify", "--json")
    res = _strict_json(out)
    assert code == 1 and res["ok"] == 1 and res["bad"][0]["key"] == victim and reason in res["bad"][0]["reason"]
    code, out, _ = _cache(capsys, "verify", "--quarantine")
    assert code == 0 and f"BAD  {victim[:12]}  manifest.json" in out and "1 quarantined" in out
    assert sorted(os.listdir(cache_root / "entries")) == [healthy]


def test_deeply_nested_manifest_from_the_console(entries: tuple[str, str], cache_root: Path) -> None:
    """The probe's case end to end: `python -m neuron_compile`, a fresh interpreter's stack depth."""
    victim, healthy = entries
    _damage(cache_root, victim, "deeply-nested")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")},
           "NEURON_COMPILE_CACHE_DIR": str(cache_root)}
    for argv, status, needle in ((["list"], 0, "(unreadable: manifest.json is nested too deeply"),
                                 (["verify", "--quarantine"], 0, "1 quarantined")):
        proc = subprocess.run([sys.executable, "-m", "neuron_compile", "cache", *argv], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == status and needle in proc.stdout, proc.stderr
        assert "Traceback" not in proc.stderr
    assert os.listdir(cache_root / "entries") == [healthy]


def test_non_numeric_compile_seconds_is_shown_as_unknown(entries: tuple[str, str], cache_root: Path,
                                                         capsys: Capsys) -> None:
    """A bad compile time loses a statistic, not the entry (lookups still hit it): shown as unknown."""
    victim, _ = entries
    _edit_manifest(cache_root, victim, _set("compile_seconds", value="abc"))
    code, out, _ = _cache(capsys, "show", victim[:8])
    assert code == 0 and "compile time: ? (not recorded)" in out and "integrity:    OK" in out
    code, out, _ = _cache(capsys, "show", victim[:8], "--json")
    assert code == 0 and _strict_json(out)["compile_seconds"] == "abc"
    _edit_manifest(cache_root, victim, _set("compile_seconds", value=float("inf")))
    code, out, _ = _cache(capsys, "show", victim[:8])
    assert code == 0 and "compile time: ? (not recorded)" in out
    code, out, _ = _cache(capsys, "list", "--json")  # strict JSON: the infinity becomes null
    assert code == 0 and {i["key"]: i for i in _strict_json(out)}[victim]["compile_seconds"] is None
    assert _cache(capsys, "verify")[0] == 0


def test_summary_nan_keeps_show_json_strict(entries: tuple[str, str], cache_root: Path, capsys: Capsys) -> None:
    victim, _ = entries
    _edit_manifest(cache_root, victim, _set("summary", "estimate", value=float("nan")))
    code, out, _ = _cache(capsys, "show", victim[:8], "--json")
    assert code == 0 and _strict_json(out)["summary"]["estimate"] is None


# -- 2. prune that cannot remove anything -------------------------------------------------------------------


def test_prune_reports_entries_it_could_not_remove(entries: tuple[str, str], cache_root: Path,
                                                   capsys: Capsys) -> None:
    # Removal renames the entry into tmp/ first; with tmp/ a plain file every rename fails (as on a
    # read-only file system, which a test can't mount).
    (cache_root / "tmp").rmdir()
    (cache_root / "tmp").write_text("in the way")
    code, out, err = _cache(capsys, "prune", "--max-size", "0")
    assert code == 1 and "Removed 0 entries (0 B); 2 entries" in out and "kept" in out
    assert f"error: could not remove 2 of 2 entries from {cache_root} (Not a directory)" in err
    code, out, err = _cache(capsys, "prune", "--max-size", "0", "--json")
    res = _strict_json(out)
    assert code == 1 and res["removed"] == [] and res["kept"] == 2 and res["kept_bytes"] > 0
    assert res["failed"] == 2 and res["error"] == "Not a directory" and "could not remove 2 of 2" in err
    assert sorted(os.listdir(cache_root / "entries")) == sorted(entries)
    code, out, _ = _cache(capsys, "prune", "--max-size", "0", "--dry-run", "--json")  # a dry run removes nothing
    assert code == 0 and len(_strict_json(out)["removed"]) == 2


# -- 3. --json on every success path -------------------------------------------------------------------------


def test_json_on_quiet_success_paths(entries: tuple[str, str], cache_root: Path, tmp_path: Path,
                                     capsys: Capsys) -> None:
    none = tmp_path / "none"  # (main() exports --cache-dir for the scripts it runs: name the root every time)
    code, out, _ = _cache(capsys, "clear", "-y", "--json", "--cache-dir", str(none))
    assert code == 0 and _strict_json(out) == {"removed": 0, "freed_bytes": 0, "failed": 0, "error": None}
    code, out, _ = _cache(capsys, "stats", "--zero", "--json", "--cache-dir", str(cache_root))
    assert code == 0 and _strict_json(out) == {"cache_dir": str(cache_root), "zeroed": True}
    code, out, _ = _cache(capsys, "stats", "--zero", "--json", "--cache-dir", str(none))
    assert code == 0 and _strict_json(out) == {"cache_dir": str(none), "zeroed": False}
    assert not none.exists()
    assert _cache(capsys, "stats", "--zero", "--cache-dir", str(cache_root))[1] == "Statistics zeroed\n"


# -- 4. export to an empty name or a folder -----------------------------------------------------------------


def test_export_needs_a_file_name(entries: tuple[str, str], tmp_path: Path, capsys: Capsys) -> None:
    code, out, err = _cache(capsys, "export", "")
    assert (code, out) == (1, "") and "error: export needs the name of the archive to write" in err
    code, _, err = _cache(capsys, "export", str(tmp_path))
    assert code == 1 and f"error: {tmp_path} is a directory; give the archive's file name" in err
    code, _, err = _cache(capsys, "export", "/")
    assert code == 1 and "error: / is a directory" in err


# -- 5. the remote cache's password ------------------------------------------------------------------------


@pytest.mark.parametrize("url,shown", [
    ("redis://admin:TopSecretPw@redis.internal:6379/0", "redis://admin:***@redis.internal:6379/0"),
    ("rediss://:TopSecretPw@cache.example/2", "rediss://:***@cache.example:6379/2"),
    ("http://admin:TopSecretPw@redis.internal/0", "http://***@redis.internal/0  (not a valid redis:// URL)"),
    ("admin:TopSecretPw@redis.internal", "***@redis.internal  (not a valid redis:// URL)"),
])
def test_stats_redacts_the_remote_password(url: str, shown: str, entries: tuple[str, str], capsys: Capsys,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_REMOTE_CACHE", url)
    code, out, err = _cache(capsys, "stats")
    assert code == 0 and "TopSecretPw" not in out + err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Remote cache ")]
    assert line.split(None, 2)[2] == shown


# -- 6. the other sub-commands' paths and choices -----------------------------------------------------------


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A script that must not run: the bad option is refused first (it would leave ran.txt behind)."""
    path = tmp_path / "train.py"
    path.write_text(f"open({str(tmp_path / 'ran.txt')!r}, 'w').write('ran')\n")
    return path


def _script_ran(script: Path) -> bool:
    return (script.parent / "ran.txt").exists()


def test_precompile_refuses_bad_paths_before_capturing(script: Path, tmp_path: Path, cache_root: Path,
                                                       capsys: Capsys) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    code, _, err = _run(capsys, "precompile", "--workers", "1", "--capture-dir", str(a_file), str(script))
    assert code == 2 and f"neuron-compile precompile: error: --capture-dir {a_file}: is a file, not a folder" in err
    missing = tmp_path / "nodir" / "r.json"
    code, _, err = _run(capsys, "precompile", "--workers", "1", "--output", str(missing), str(script))
    assert code == 2 and f"error: --output {missing}: the folder {missing.parent} does not exist" in err
    code, _, err = _run(capsys, "precompile", "--workers", "1", "--output", str(tmp_path), str(script))
    assert code == 2 and f"error: --output {tmp_path}: is a directory; give a file name" in err
    code, _, err = _run(capsys, "precompile", "--output", str(a_file / "r{rank}.json"), str(script))
    assert code == 2 and f"the folder {a_file} is not a directory" in err
    assert not _script_ran(script)


def test_check_refuses_bad_output_before_running(script: Path, tmp_path: Path, capsys: Capsys) -> None:
    missing = tmp_path / "nodir" / "x.json"
    code, out, err = _run(capsys, "check", "--output", str(missing), str(script))
    assert (code, out) == (2, "") and f"neuron-compile check: error: --output {missing}: the folder" in err
    code, _, err = _run(capsys, "check", "--output", "", str(script))
    assert code == 2 and "error: --output needs a file name" in err
    assert not _script_ran(script)


def test_explain_target_must_be_known(script: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _run(capsys, "explain", "--target", "bogus", str(script))
    assert code == 2 and "argument --target: invalid choice: 'bogus'" in err and "trn2" in err
    monkeypatch.setenv("NEURON_COMPILE_TARGET", "bogus")
    code, _, err = _run(capsys, "explain", str(script))
    assert code == 2 and "neuron-compile explain: error: NEURON_COMPILE_TARGET=bogus: expected one of" in err
    assert not _script_ran(script)


def test_ops_markdown_to_a_directory(tmp_path: Path, capsys: Capsys) -> None:
    code, out, err = _run(capsys, "ops", "--markdown", str(tmp_path))
    assert (code, out) == (2, "") and f"neuron-compile ops: error: --markdown '{tmp_path}' is a directory" in err
    code, _, err = _run(capsys, "ops", "--markdown", str(tmp_path), "--check")
    assert code == 2 and "is a directory" in err


# -- 7. a root that is a file, import of a folder, a malformed NEURON_COMPILE_CACHE ---------------------------


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["stats"], ["show", "abc"], ["verify"],
                                  ["prune", "--max-size", "1M"], ["clear", "-y"], ["diff", "ab", "cd"]])
def test_root_that_is_a_file_is_an_error(argv: list[str], tmp_path: Path, cache_root: Path, capsys: Capsys) -> None:
    # (cache_root: main() exports --cache-dir; the fixture restores NEURON_COMPILE_CACHE_DIR afterwards)
    root = tmp_path / "passwd"
    root.write_text("root:x:0:0::/root:/bin/sh\n")
    code, out, err = _cache(capsys, "--cache-dir", str(root), *argv)
    assert (code, out) == (1, "") and f"error: {root} (the cache directory) is not a directory" in err
    assert root.read_text().startswith("root:")


def test_import_of_a_directory(tmp_path: Path, cache_root: Path, capsys: Capsys) -> None:
    code, _, err = _cache(capsys, "import", str(tmp_path))
    assert code == 1 and f"error: {tmp_path} is a directory, not an archive" in err
    code, _, err = _cache(capsys, "import", str(tmp_path / "nope.tgz"))
    assert code == 1 and "nope.tgz: no such file" in err


@pytest.mark.parametrize("verb", ["path", "list", "stats", "verify", "show"])
def test_malformed_cache_setting_fails_every_verb(verb: str, entries: tuple[str, str], capsys: Capsys,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE", "maybe")
    argv = [verb, entries[0][:8]] if verb == "show" else [verb]
    code, out, err = _cache(capsys, *argv)
    assert (code, out) == (1, "") and err.startswith("error: NEURON_COMPILE_CACHE=maybe: expected")
