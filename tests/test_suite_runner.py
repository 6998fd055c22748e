"""tests/run.py: the test files dealt out to shards by recorded time, and a real two-shard run of a small suite."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "run.py"


def _runner():
    spec = importlib.util.spec_from_file_location("suite_runner", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_longest_files_go_first_to_the_least_loaded_shard():
    run = _runner()
    durations = {"a.py": 10.0, "b.py": 6.0, "c.py": 5.0, "d.py": 1.0}
    assert run.shard(list(durations), durations, 2) == [["a.py", "d.py"], ["b.py", "c.py"]]
    # a file with no record counts as the median of the recorded ones (of two, the upper: 10)
    assert run.shard(["a.py", "b.py", "new.py"], {"a.py": 10.0, "b.py": 6.0}, 2) == [["a.py", "b.py"], ["new.py"]]
    # nothing recorded: files are dealt out evenly; never an empty shard
    assert run.shard(["x.py", "y.py", "z.py"], {}, 2) == [["x.py", "z.py"], ["y.py"]]
    assert run.shard(["x.py"], {}, 2) == [["x.py"]]


def test_every_test_module_of_the_suite_is_in_a_shard():
    run = _runner()
    files = run.test_files()
    assert "tests/test_suite_runner.py" in files and "tests/cache/test_cache_remote.py" in files
    groups = run.shard(files, run.load_durations(), 2)
    assert sorted(f for g in groups for f in g) == files


def test_two_shards_run_report_and_fail_together(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(RUNNER, tests / "run.py")
    (tests / "test_good.py").write_text("def test_one():\n    assert 1 + 1 == 2\n\ndef test_two():\n    pass\n")
    (tests / "test_bad.py").write_text("def test_wrong():\n    assert 2 + 2 == 5\n")
    cmd = [sys.executable, str(tests / "run.py"), "-j", "2", "--record"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("2 passed, 1 failed, 0 errors, 0 skipped in "), lines[-1]
    assert "exit 1" in lines[-1] and "exit 0" in lines[-1]
    assert any(line.startswith("[1] ") for line in lines) and any(line.startswith("[2] ") for line in lines)
    assert "[1] FAILED tests/test_bad.py::test_wrong - assert (2 + 2) == 5" in lines or \
        "[2] FAILED tests/test_bad.py::test_wrong - assert (2 + 2) == 5" in lines
    recorded = json.loads((tests / "durations.json").read_text())
    assert sorted(recorded) == ["tests/test_bad.py", "tests/test_good.py"]


def test_bad_job_count_is_refused(capsys):
    run = _runner()
    try:
        run.main(["-j", "0"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("-j 0 was accepted")
    assert "-j/--jobs must be at least 1, got 0" in capsys.readouterr().err
