"""Persistent cache statistics: hits, misses, compile time saved, bytes.

Owns ``<root>/stats.jsonl``: one JSON event per line, appended with a single ``write`` on an
``O_APPEND`` descriptor (atomic for lines under PIPE_BUF on local filesystems), so any number of
processes can record concurrently without locks. :func:`read_stats` aggregates the events after
the last ``zero`` record. ``zero_stats`` replaces the file with a single ``zero`` record; when the
file outgrows :data:`COMPACT_BYTES` it is rewritten as one ``totals`` record (an event appended
during that instant may be lost: statistics, not bookkeeping).

Events: ``hit`` (saved: the entry's compile seconds, load: lookup+read seconds, ``whole_graph``:
a whole Dynamo graph served without tracing, ``origin: remote`` when fetched from the remote tier),
``miss`` (compile: seconds, bytes: published bytes or 0), ``corrupt``, ``lock_timeout``,
``write_error``; the remote tier's ``remote_hits``/``remote_misses``/``remote_errors``/
``remote_published``/``remote_rejected`` (bytes where data moved) feed the ``remote`` section.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATS_FILE = "stats.jsonl"
COMPACT_BYTES = 4 << 20

_COUNTERS = ("hits", "local_hits", "misses", "corrupt", "lock_timeouts", "write_errors", "whole_graph_hits")
_REMOTE = ("hits", "misses", "errors", "published", "rejected", "bytes_fetched", "bytes_published")
_SUMS = ("compile_seconds_saved", "compile_seconds_spent", "load_seconds", "bytes_written")
_EVENT_COUNTER = {"hit": "hits", "miss": "misses", "corrupt": "corrupt", "lock_timeout": "lock_timeouts",
                  "write_error": "write_errors"}


def _empty() -> dict[str, Any]:
    out: dict[str, Any] = {name: 0 for name in _COUNTERS}
    out.update({name: 0.0 for name in _SUMS})
    out["bytes_written"] = 0
    out["since"] = None
    out["remote"] = {name: 0 for name in _REMOTE}
    return out


def record(root: Path, event: str, **fields: object) -> None:
    """Append one event; never raises (statistics must not break a compile)."""
    line = json.dumps({"t": round(time.time(), 3), "ev": event, **fields}, separators=(",", ":")) + "\n"
    path = root / STATS_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    except OSError as exc:
        log.debug("neuron-compile cache: cannot record stats in %s: %s", path, exc)
        return
    if size > COMPACT_BYTES:
        _rewrite(root, {"ev": "totals", **read_stats(root)})


def _apply(totals: dict[str, Any], ev: dict[str, Any]) -> None:
    kind = ev.get("ev")
    if kind == "zero":
        totals.clear()
        totals.update(_empty())
        totals["since"] = ev.get("t")
        return
    if kind == "totals":
        for name in (*_COUNTERS, *_SUMS):
            if isinstance(ev.get(name), (int, float)):
                totals[name] += ev[name]
        remote = ev.get("remote") if isinstance(ev.get("remote"), dict) else {}
        for name in _REMOTE:
            if isinstance(remote.get(name), (int, float)):
                totals["remote"][name] += remote[name]
        if totals["since"] is None:
            totals["since"] = ev.get("since")
        return
    if totals["since"] is None:
        totals["since"] = ev.get("t")
    if isinstance(kind, str) and kind.startswith("remote_"):
        name = kind.removeprefix("remote_")
        if name in _REMOTE:
            totals["remote"][name] += 1
            totals["remote"]["bytes_fetched" if name == "hits" else "bytes_published"] += \
                int(ev.get("bytes", 0)) if name in ("hits", "published") else 0
        return
    counter = _EVENT_COUNTER.get(str(kind))
    if counter:
        totals[counter] += 1
    if kind == "hit" and ev.get("whole_graph"):
        totals["whole_graph_hits"] += 1
    if kind == "hit" and ev.get("origin") != "remote":
        totals["local_hits"] += 1
    if kind == "hit":
        totals["compile_seconds_saved"] += float(ev.get("saved", 0.0))
        totals["load_seconds"] += float(ev.get("load", 0.0))
    elif kind == "miss":
        totals["compile_seconds_spent"] += float(ev.get("compile", 0.0))
        totals["bytes_written"] += int(ev.get("bytes", 0))


def read_stats(root: Path) -> dict[str, Any]:
    """Aggregate the event log (an absent file reads as all zeros); garbage lines are skipped."""
    totals = _empty()
    try:
        text = (root / STATS_FILE).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            try:
                _apply(totals, ev)
            except (TypeError, ValueError):
                continue
    lookups = totals["hits"] + totals["misses"]
    totals["hit_rate"] = totals["hits"] / lookups if lookups else None
    for name in _SUMS:
        if isinstance(totals[name], float):
            totals[name] = round(totals[name], 6)
    return totals


def _rewrite(root: Path, record_: dict[str, Any]) -> bool:
    path = root / STATS_FILE
    tmp = root / f"{STATS_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(record_, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.debug("neuron-compile cache: cannot rewrite %s: %s", path, exc)
        try:
            tmp.unlink()
        except OSError:
            pass
        return False


def zero_stats(root: Path) -> bool:
    """Reset the statistics (``neuron-compile cache stats --zero``); False if the file can't be written."""
    return _rewrite(root, {"t": round(time.time(), 3), "ev": "zero"})
