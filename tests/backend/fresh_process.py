"""Fresh Python processes that run while the test session goes on: a module starts its scenarios together and
each test waits for its own, so on two cores they overlap each other and the in-process tests in between."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Started:
    """A fresh Python process started now; the test that needs it waits for it (output goes to files, so a
    chatty process never blocks on a full pipe while nobody reads it)."""

    def __init__(self, code: str, env: dict[str, str], folder: Path) -> None:
        folder.mkdir(parents=True)
        self.env = env
        self.out, self.err = folder / "stdout", folder / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=out, stderr=err,
                                         text=True, env=dict(os.environ, **env), cwd=REPO)

    def result(self) -> subprocess.CompletedProcess:
        code = self.proc.wait(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, code, self.out.read_text(), self.err.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
