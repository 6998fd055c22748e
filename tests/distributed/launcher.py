"""Start a script under ``torchrun`` for tests, reap every process, and never wait forever.

:func:`torchrun` picks a free ``--master_port``, starts ``python -m torch.distributed.run`` in its own
session (so the launcher and every rank can be killed as one process group), and waits at most
``timeout`` seconds. A job that does not finish in time (a rank hung on a collective) is killed and
reported with :class:`RankHangError`, which names the ranks that did not finish and where each one
stopped (from the ``rank<N>.progress`` files the worker writes) and carries the output tail. Each rank of
``worker.py`` writes ``rank<N>.json`` into the folder passed as ``--out``; :class:`Job` loads them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class RankHangError(AssertionError):
    """A torchrun job did not finish within its time limit (killed, with its output)."""


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    out_dir: Path
    ranks: list[dict[str, Any]] = field(default_factory=list)

    def tail(self, n: int = 60) -> str:
        lines = (self.stdout + "\n" + self.stderr).splitlines()
        return "\n".join(lines[-n:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(script: Path, args: list[str], out_dir: Path, *, nproc: int = 2, timeout: float = 120.0,
             stall: float | None = None, env: dict[str, str] | None = None, out_arg: bool = True) -> Job:
    """Run ``script args`` on ``nproc`` ranks; return the job once every process exited.

    The job is killed (:class:`RankHangError`) after ``timeout`` seconds, or once every rank has started
    its first case and no rank's progress file changed for ``stall`` seconds. ``out_arg=False`` runs a script
    that takes no ``--out`` (an example): it still gets a free port, the time limit and the reaping."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    for attempt in range(3):  # another process may take the port between our probe and torchrun's bind
        port = free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={port}", str(script),
               *(["--out", str(out_dir)] if out_arg else []), *args]
        # Output goes to files, not pipes: a rank that outlived torchrun would keep a pipe open forever.
        out_path, err_path = out_dir / "torchrun.out", out_dir / "torchrun.err"
        with out_path.open("w") as out_f, err_path.open("w") as err_f:
            proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True, env=full_env,
                                    start_new_session=True, cwd=str(HERE))
            try:
                why = _wait(proc, out_dir, nproc, timeout, stall)
                if why:
                    _kill_job(proc, out_dir, nproc)
                    tail = "\n".join((out_path.read_text() + "\n" + err_path.read_text()).splitlines()[-60:])
                    raise RankHangError(f"torchrun job {script.name} {' '.join(args)} {why}; killed. "
                                        f"{stuck_ranks(out_dir, nproc)}. Output tail:\n{tail}")
            finally:
                if proc.poll() is None:  # pragma: no cover - interrupted (KeyboardInterrupt) while waiting
                    _kill_job(proc, out_dir, nproc)
        stdout, stderr = out_path.read_text(), err_path.read_text()
        if proc.returncode != 0 and "address already in use" in stderr.lower() and attempt < 2:
            continue
        break
    ranks = []
    for r in range(nproc):
        path = out_dir / f"rank{r}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else {})
    return Job(proc.returncode, stdout, stderr, out_dir, ranks)


def _wait(proc: subprocess.Popen[str], out_dir: Path, nproc: int, timeout: float, stall: float | None) -> str:
    """Wait for the job; '' when it exited, else why it is considered hung."""
    start = time.monotonic()
    last_change, seen = start, None
    progress = [out_dir / f"rank{r}.progress" for r in range(nproc)]
    while proc.poll() is None:
        now = time.monotonic()
        if now - start > timeout:
            return f"did not finish within {timeout:g} s"
        if stall is not None and all(p.exists() for p in progress):
            state = tuple(p.stat().st_mtime_ns for p in progress)
            if state != seen:
                seen, last_change = state, now
            elif now - last_change > stall:
                return f"made no progress for {stall:g} s"
        time.sleep(0.2)
    return ""


def stuck_ranks(out_dir: Path, nproc: int) -> str:
    """Which ranks did not finish and where each stopped, from the worker's ``rank<N>.progress`` files."""
    parts = []
    for r in range(nproc):
        if (out_dir / f"rank{r}.json").exists():
            continue
        progress = out_dir / f"rank{r}.progress"
        where = progress.read_text() if progress.exists() else "before its first case"
        if where.startswith("after "):
            parts.append(f"rank {r} waiting for the other ranks after case '{where[6:]}'")
        else:
            parts.append(f"rank {r} hung in case '{where}'" if progress.exists() else f"rank {r} hung {where}")
    return "; ".join(parts) if parts else "every rank wrote its result (torchrun itself did not exit)"


def _kill_job(proc: subprocess.Popen[str], out_dir: Path, nproc: int) -> None:
    """Stop torchrun and every rank. torchrun starts each rank in its own session, so killing torchrun's
    process group does not reach them: ask torchrun to stop them (SIGTERM), then SIGKILL whatever is left,
    each rank by the pid it wrote into ``rank<N>.pid``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for r in range(nproc):
        pid_file = out_dir / f"rank{r}.pid"
        if pid_file.exists():
            _kill_if_ours(int(pid_file.read_text()))
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _kill_if_ours(pid: int) -> None:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return  # already gone
    if b"worker.py" in cmdline:  # the pid was not reused by an unrelated process
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
