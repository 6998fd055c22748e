"""The compile progress bar: one line on stderr while a graph's kernels render.

Drawn only when stderr is a terminal, ``CI`` is unset and the graph has many kernels
(``config.progress``: auto/always/never). Hand-written rather than taken from a library: torch installs no
progress-bar package (tqdm/rich are not dependencies), and this needs 40 lines.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from neuron_compile.config import config

log = logging.getLogger(__name__)

PROGRESS_MIN_KERNELS = 24  # fewer kernels render in well under a second: no bar


class Progress:
    """A kernel-rendering progress bar on stderr (a no-op unless enabled, see the module docstring)."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.enabled = self.wanted(total)
        self._last = 0.0

    @staticmethod
    def wanted(total: int) -> bool:
        mode = config.progress
        if mode == "never":
            return False
        if mode == "always":
            return True
        if os.environ.get("CI") or not hasattr(sys.stderr, "isatty") or not sys.stderr.isatty():
            return False
        return total >= PROGRESS_MIN_KERNELS

    def tick(self, what: str = "") -> None:
        if not self.enabled:
            return
        self.done += 1
        now = time.monotonic()
        if self.done < self.total and now - self._last < 0.05:
            return
        self._last = now
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{what[:30]:<30}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            sys.stderr.write("\n")
            sys.stderr.flush()
