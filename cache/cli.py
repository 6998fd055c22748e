"""``neuron-compile cache``: inspect and manage the artifact cache from a shell.

Owns the sub-command's argparse tree (``add_arguments``) and its verbs (``run``): ``path``,
``list``, ``show``, ``stats``, ``verify``, ``prune``, ``clear``, ``diff``, ``export``, ``import``.
Conventions follow ``pip cache``/``uv cache``/``ccache -s``: tables for people, ``--json`` for
scripts (schemas in docs/cache.md), exit 0 ok / 1 error / 2 usage. Read-only verbs never create
the cache folder; a missing or empty cache is reported, not an error (a root that is a file is one).
An entry whose manifest can't be read or has fields of the wrong type is listed as unreadable and
reported by ``show``/``diff``/``verify`` as corrupt. ``main(argv)`` runs it alone.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_compile.cache import stats as cache_stats
from neuron_compile.cache.key import flatten_parts
from neuron_compile.cache.lock import is_held
from neuron_compile.cache.manifest import CorruptEntry, dir_size, last_used, read_manifest, verify_entry
from neuron_compile.cache.resp import parse_redis_url
from neuron_compile.cache.store import CacheStore, check_root, default_root
from neuron_compile.cache.transfer import ArchiveError, entry_info, export_entries, import_archive

from neuron_compile.config import config
from neuron_compile.errors import ConfigError

log = logging.getLogger(__name__)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_STALE_TMP = 3600.0


class CliError(Exception):
    """A user-facing failure: printed as ``error: ...``, exit status 1."""


# ------------------------------------------------------------------------------------------------
# Parsing helpers


def parse_size(text: str) -> int:
    """``"500M"`` -> 524288000. Units K, M, G, T are binary (KiB...), optional ``B``/``iB``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtb]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected e.g. 500M, 2G, 1.5GiB, 100K")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_age(text: str) -> float:
    """``"7d"`` -> 604800.0 seconds. Units s, m, h, d, w (a bare number is seconds)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid age {text!r}: expected e.g. 7d, 12h, 30m, 2w")
    return float(m.group(1)) * _AGE_UNITS[(m.group(2) or "s").lower()]


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def ago(ts: float | None, now: float | None = None) -> str:
    if not ts or not _finite_number(ts):
        return "-"
    delta = max(0.0, (now or time.time()) - ts)
    for limit, unit, div in ((60, "s", 1), (3600, "m", 60), (86400, "h", 3600), (float("inf"), "d", 86400)):
        if delta < limit:
            return f"{int(delta // div)}{unit} ago"
    return "-"


def iso(ts: float | None) -> str | None:
    if not ts:
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))
    except (TypeError, ValueError, OverflowError, OSError):  # NaN, or beyond what the platform's time_t holds
        return "?"


def _finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns (no table package ships with torch, and three lines don't need one)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _ops_label(ops: dict[str, int], limit: int = 3) -> str:
    items = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    short = [f"{name.removeprefix('aten.').split('.')[0]}×{n}" for name, n in items[:limit]]
    return ", ".join(short) + (f", +{len(items) - limit}" if len(items) > limit else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_safe(value: object) -> object:
    """``value`` with NaN and infinities (which a hand-edited manifest may hold) as null: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _emit(data: object) -> None:
    print(json.dumps(_json_safe(data), indent=2, sort_keys=True, default=str, allow_nan=False))


# ------------------------------------------------------------------------------------------------
# Store helpers


def _root(args: argparse.Namespace) -> Path:
    cache_dir = getattr(args, "cache_dir", None)
    return Path(os.path.abspath(os.path.expanduser(cache_dir))) if cache_dir else default_root()


def _store(args: argparse.Namespace) -> CacheStore:
    """The store at the chosen root; a root (or its ``entries/``) that exists but is not a folder is an error,
    not an empty cache."""
    root = _root(args)
    for path in (root, root / "entries"):
        if os.path.lexists(path) and not path.is_dir():
            what = "the cache directory" if path == root else "its entries folder"
            raise CliError(f"{path} ({what}) is not a directory; point --cache-dir or NEURON_COMPILE_CACHE_DIR at "
                           "a cache folder (a missing one is fine: it is created on first use)")
    return CacheStore(root)


def _writable_store(args: argparse.Namespace) -> CacheStore:
    store = _store(args)
    problem = check_root(store.root, allow_shared=bool(config.cache_allow_shared))
    if problem:
        raise CliError(problem)
    return store


def resolve_prefix(store: CacheStore, prefix: str) -> str:
    """The one digest starting with ``prefix`` (CliError when invalid, unknown or ambiguous)."""
    p = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,64}", p):
        raise CliError(f"{prefix!r} is not a key prefix (expected hex digits, as shown by `neuron-compile cache list`)")
    matches = [d for d in store.digests() if d.startswith(p)]
    if not matches:
        raise CliError(f"no cache entry matches key prefix {prefix!r} in {store.root}")
    if len(matches) > 1:
        shown = ", ".join(m[:12] for m in matches[:5]) + (", …" if len(matches) > 5 else "")
        raise CliError(f"key prefix {prefix!r} is ambiguous: it matches {len(matches)} entries ({shown}); "
                       "give more digits")
    return matches[0]


def _entry_info(store: CacheStore, digest: str) -> dict[str, Any]:
    """:func:`entry_info`, with a manifest whose contents it can't summarise reported as unreadable."""
    try:
        return entry_info(store, digest)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError, RecursionError) as exc:
        path = store.entry_path(digest)
        return {"key": digest, "valid": False, "problem": f"manifest.json has unexpected contents ({exc})",
                "path": str(path), "size": dir_size(path), "last_used": last_used(path), "created": None,
                "kind": None, "graph": {}, "inputs": [], "kernels": [], "files": 0, "compile_seconds": None}


def _infos(store: CacheStore) -> list[dict[str, Any]]:
    return [_entry_info(store, d) for d in store.digests()]


# ------------------------------------------------------------------------------------------------
# Verbs


def cmd_path(args: argparse.Namespace) -> int:
    print(_root(args))
    if not config.cache:
        print("note: the cache is disabled (NEURON_COMPILE_CACHE=0)", file=sys.stderr)
    return 0


_SORTS = {"last-used": lambda i: -(i["last_used"] or 0), "size": lambda i: -i["size"],
          "created": lambda i: -(i["created"] or 0)}


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    infos = sorted(_infos(store), key=_SORTS[args.sort])
    if args.json:
        _emit(infos)
        return 0
    if not infos:
        print(f"No cache entries in {store.root}")
        return 0
    now = time.time()
    rows = []
    for i in infos:
        if not i["valid"]:
            rows.append([i["key"][:12], "?", f"(unreadable: {i['problem']})", "", "", human_size(i["size"]),
                         ago(i["last_used"], now)])
            continue
        graph = f"{i['graph'].get('nodes', '?')} nodes: {_ops_label(i['graph'].get('ops') or {})}"
        if i.get("function"):  # a Dynamo package: no graph of its own, its graphs are other entries
            graph = f"package of {i['function']}"
        kernels = f"{len(i['kernels'])}: {', '.join(i['kernels'])}" if i["kernels"] else "0"
        rows.append([i["key"][:12], str(i["kind"]), _clip(graph, 40), _clip(" ".join(i["inputs"]), 30),
                     _clip(kernels, 30), human_size(i["size"]), ago(i["last_used"], now)])
    print(_table(rows, ["KEY", "KIND", "GRAPH", "INPUTS", "KERNELS", "SIZE", "LAST USED"]))
    total = sum(i["size"] for i in infos)
    print(f"\n{len(infos)} entries, {human_size(total)} in {store.root}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    digest = resolve_prefix(store, args.key)
    path = store.entry_path(digest)
    try:
        manifest = read_manifest(path)
    except CorruptEntry as exc:
        raise CliError(f"entry {digest[:12]} is corrupt ({exc.reason}); run `neuron-compile cache verify "
                       "--quarantine`") from None
    try:
        _, data = verify_entry(path, digest)
        problem = None
    except CorruptEntry as exc:
        data, problem = {}, exc.reason
    info = _entry_info(store, digest)
    if args.json:
        out = {**manifest, "path": str(path), "last_used": info["last_used"], "valid": problem is None,
               "problem": problem}
        if args.source:
            out["sources"] = {n: b.decode() for n, b in data.items() if _is_text(b)}
        _emit(out)
        return 0 if problem is None else 1
    print(f"key:          {digest}")
    print(f"path:         {path}")
    print(f"integrity:    {'OK' if problem is None else 'CORRUPT: ' + problem}")
    print(f"kind:         {info['kind']}")
    print(f"inputs:       {' '.join(info['inputs'])}")
    if info.get("function"):
        print(f"function:     {info['function']} (a Dynamo package; its graphs are the entries it names)")
    else:
        print(f"graph:        {info['graph'].get('nodes')} nodes; ops: "
              + ", ".join(f"{k}×{v}" for k, v in (info["graph"].get("ops") or {}).items()))
    print(f"kernels:      {', '.join(info['kernels']) or '-'}")
    print(f"created:      {iso(manifest['created'])}")
    print(f"last used:    {iso(info['last_used'])} ({ago(info['last_used'])})")
    seconds = manifest.get("compile_seconds", 0.0)
    print(f"compile time: {f'{seconds:.3f} s' if _finite_number(seconds) else '? (not recorded)'}")
    print(f"size:         {human_size(info['size'])}")
    print("files:")
    for name, meta in sorted(manifest["files"].items()):
        print(f"  {name:40} {meta['size']:>10}  sha256:{meta['sha256'][:16]}")
    if manifest.get("summary"):
        print("summary:")
        for name, value in sorted(manifest["summary"].items()):
            print(f"  {name}: {json.dumps(value, default=str)}")
    print("key parts:")
    for name, value in flatten_parts(manifest["key_parts"]).items():
        print(f"  {name:40} {json.dumps(value, sort_keys=True)}")
    if args.source:
        for name, blob in sorted(data.items()):
            if _is_text(blob):
                print(f"\n# ==> {name} <==")
                print(blob.decode().rstrip("\n"))
    return 0 if problem is None else 1


def _is_text(blob: bytes) -> bool:
    try:
        blob.decode()
    except UnicodeDecodeError:
        return False
    return True


def cmd_stats(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.zero:
        zeroed = store.root.is_dir()
        if zeroed and not cache_stats.zero_stats(store.root):
            raise CliError(f"cannot write {store.root / cache_stats.STATS_FILE}")
        if args.json:
            _emit({"cache_dir": str(store.root), "zeroed": zeroed})
        else:
            print("Statistics zeroed" if zeroed else f"No cache at {store.root}: nothing to zero")
        return 0
    totals = cache_stats.read_stats(store.root)
    infos = _infos(store)
    report = {"cache_dir": str(store.root), "enabled": bool(config.cache), "entries": len(infos),
              "size_bytes": sum(i["size"] for i in infos), **totals}
    if args.json:
        _emit(report)
        return 0
    lookups = totals["hits"] + totals["misses"]
    rate = f" ({100 * totals['hit_rate']:.1f}%)" if lookups else ""
    avg_load = totals["load_seconds"] / totals["hits"] * 1e3 if totals["hits"] else 0.0
    rows = [
        ("Cache directory", str(store.root) + ("" if config.cache else "  (disabled: NEURON_COMPILE_CACHE=0)")),
        ("Entries", str(len(infos))),
        ("Size on disk", human_size(report["size_bytes"])),
        ("Hits", f"{totals['hits']}{rate}" + (f", {totals['local_hits']} local" if totals["remote"]["hits"] else "")),
        ("Misses", str(totals["misses"])),
        ("Compile time saved", f"{totals['compile_seconds_saved']:.2f} s"),
        ("Compile time spent", f"{totals['compile_seconds_spent']:.2f} s"),
        ("Average hit load time", f"{avg_load:.1f} ms"),
        ("Bytes written", human_size(totals["bytes_written"])),
        ("Whole-graph hits", str(totals["whole_graph_hits"])),
        ("Corrupt entries quarantined", str(totals["corrupt"])),
        ("Lock wait timeouts", str(totals["lock_timeouts"])),
        ("Write errors", str(totals["write_errors"])),
        ("Since", iso(totals["since"]) or "-"),
    ]
    remote = totals["remote"]
    if any(remote.values()) or config.remote_cache:
        rows += [
            ("Remote cache", _redacted_url(config.remote_cache) if config.remote_cache else "(not configured now)"),
            ("Remote hits", str(remote["hits"])),
            ("Remote misses", str(remote["misses"])),
            ("Remote published", str(remote["published"])),
            ("Remote rejected", str(remote["rejected"])),
            ("Remote errors", str(remote["errors"])),
        ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _redacted_url(url: str) -> str:
    """The remote cache URL without its password (``stats`` output is pasted into tickets and chats)."""
    try:
        return parse_redis_url(url).redacted()
    except ValueError:  # its message quotes the URL, password included: say less
        text = url.strip()
        if "@" in text:  # whatever precedes the last '@' may hold credentials
            head, _, tail = text.rpartition("@")
            text = (head.split("://", 1)[0] + "://" if "://" in head else "") + "***@" + tail
        return text + "  (not a valid redis:// URL)"


def cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    digests = store.digests()
    bad: list[dict[str, Any]] = []
    unverifiable: list[dict[str, str]] = []
    recompile = None
    if args.recompile:
        from neuron_compile.rebuild import VerificationFailed, verify_by_recompiling

        recompile = verify_by_recompiling
    for digest in digests:
        try:
            manifest, data = verify_entry(store.entry_path(digest), digest, check_parts=True)
            if recompile is not None:
                try:
                    recompile(manifest, data)
                except VerificationFailed as exc:
                    if not exc.unverifiable:
                        raise CorruptEntry(exc.reason) from None
                    unverifiable.append({"key": digest, "reason": exc.reason})
        except CorruptEntry as exc:
            moved = store.quarantine(digest, exc.reason) if args.quarantine else None
            bad.append({"key": digest, "reason": exc.reason, "quarantined": str(moved) if moved else None})
    remaining = [b for b in bad if not b["quarantined"]]
    if args.json:
        out: dict[str, Any] = {"checked": len(digests), "ok": len(digests) - len(bad), "bad": bad}
        if args.recompile:
            out["unverifiable"] = unverifiable
        _emit(out)
    else:
        for b in bad:
            where = f" -> moved to {b['quarantined']}" if b["quarantined"] else ""
            print(f"BAD  {b['key'][:12]}  {b['reason']}{where}")
        for u in unverifiable:
            print(f"SKIP {u['key'][:12]}  not recompiled: {u['reason']}")
        print(f"{len(digests)} entries checked, {len(digests) - len(bad)} ok, {len(bad)} bad"
              + (f", {len(bad) - len(remaining)} quarantined" if args.quarantine else "")
              + (f", {len(unverifiable)} not recompilable here" if args.recompile else ""))
        if remaining:
            print("run `neuron-compile cache verify --quarantine` to move the bad entries aside", file=sys.stderr)
    return 1 if remaining else 0


def _clean_aside(store: CacheStore, min_age: float) -> int:
    """Remove quarantined entries and temp leftovers older than ``min_age`` seconds; returns bytes freed."""
    freed = 0
    now = time.time()
    for sub in ("quarantine", "tmp"):
        folder = store.root / sub
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = folder / name
            try:
                if now - path.lstat().st_mtime < min_age:
                    continue
                size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else \
                    path.stat().st_size
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                freed += size
            except OSError:
                continue
    return freed


def cmd_prune(args: argparse.Namespace) -> int:
    if args.max_size is None and args.older_than is None:
        args.parser.error("prune needs --max-size SIZE and/or --older-than AGE")
    store = _store(args)
    infos = sorted(_infos(store), key=lambda i: i["last_used"] or 0)  # least recently used first
    now = time.time()
    doomed: list[dict[str, Any]] = []
    keep: list[dict[str, Any]] = []
    for i in infos:
        too_old = args.older_than is not None and now - (i["last_used"] or 0) > args.older_than
        (doomed if too_old else keep).append(i)
    if args.max_size is not None:
        total = sum(i["size"] for i in keep)
        while keep and total > args.max_size:
            victim = keep.pop(0)
            doomed.append(victim)
            total -= victim["size"]
    removed: list[dict[str, Any]] = []
    failures: list[str] = []
    for i in doomed:
        problem = None if args.dry_run else store.remove_reason(i["key"])
        if problem is None:
            removed.append(i)
        else:  # still there (a read-only root...): it is kept, and the command fails below
            failures.append(problem)
            keep.append(i)
    freed = sum(i["size"] for i in removed)
    if not args.dry_run and store.root.is_dir():
        freed += _clean_aside(store, args.older_than if args.older_than is not None else _STALE_TMP)
    kept = sum(i["size"] for i in keep)
    if args.json:
        _emit({"removed": [i["key"] for i in removed], "freed_bytes": freed, "kept": len(keep),
               "kept_bytes": kept, "dry_run": args.dry_run, "failed": len(failures),
               "error": failures[0] if failures else None})
    else:
        verb = "Would remove" if args.dry_run else "Removed"
        for i in removed:
            print(f"{verb} {i['key'][:12]}  {human_size(i['size'])}  last used {ago(i['last_used'], now)}")
        print(f"{verb} {len(removed)} entries ({human_size(freed)}); {len(keep)} entries ({human_size(kept)}) kept")
    if failures:
        raise CliError(f"could not remove {len(failures)} of {len(doomed)} entries from {store.root} ({failures[0]}); "
                       "they are still there, counted as kept")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    store = _store(args)
    digests = store.digests()
    if not store.root.is_dir():
        if args.json:
            _emit({"removed": 0, "freed_bytes": 0, "failed": 0, "error": None})
        else:
            print(f"No cache at {store.root}: nothing to clear")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"refusing to clear {len(digests)} entries in {store.root} without confirmation: "
                           "pass --yes")
        answer = input(f"Remove all {len(digests)} entries in {store.root}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Aborted")
            return 1
    size = 0
    removed = 0
    failures: list[str] = []
    for d in digests:
        entry_size = dir_size(store.entry_path(d))
        problem = store.remove_reason(d)
        if problem is None:
            removed += 1
            size += entry_size
        else:
            failures.append(problem)
    size += _clean_aside(store, 0.0)
    for lock in (store.root / "locks").glob("*.lock"):
        if not is_held(lock):
            try:
                lock.unlink()
            except OSError:
                pass
    if args.json:
        _emit({"removed": removed, "freed_bytes": size, "failed": len(failures),
               "error": failures[0] if failures else None})
    else:
        print(f"Removed {removed} entries ({human_size(size)}) from {store.root}")
    if failures:
        raise CliError(f"could not remove {len(failures)} of {len(digests)} entries from {store.root} ({failures[0]})")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    store = _store(args)
    digests = [resolve_prefix(store, args.key_a), resolve_prefix(store, args.key_b)]
    manifests = []
    for digest in digests:
        try:
            manifests.append(read_manifest(store.entry_path(digest)))
        except CorruptEntry as exc:
            raise CliError(f"entry {digest[:12]} is corrupt ({exc.reason})") from None
    flat_a, flat_b = (flatten_parts(m["key_parts"]) for m in manifests)
    missing = object()
    diffs = [{"part": name, "a": flat_a.get(name), "b": flat_b.get(name),
              "only_in": "a" if name not in flat_b else "b" if name not in flat_a else None}
             for name in sorted(set(flat_a) | set(flat_b), key=lambda n: (list(flat_a).index(n) if n in flat_a else 1e9, n))
             if flat_a.get(name, missing) != flat_b.get(name, missing)]
    graph_diff: list[str] = []
    texts = [m.get("graph_text") if isinstance(m.get("graph_text"), str) else "" for m in manifests]
    if texts[0] != texts[1] and all(texts):
        graph_diff = [line.rstrip("\n") for line in difflib.unified_diff(
            texts[0].splitlines(), texts[1].splitlines(), f"a/{digests[0][:12]}", f"b/{digests[1][:12]}", lineterm="")]
    if args.json:
        _emit({"a": digests[0], "b": digests[1], "identical": not diffs, "differences": diffs,
               "graph_diff": graph_diff})
        return 0
    if not diffs:
        print(f"{digests[0][:12]} and {digests[1][:12]} have identical key parts")
        return 0
    print(f"{len(diffs)} key part(s) differ between a={digests[0][:12]} and b={digests[1][:12]}:")
    rows = [[d["part"], _clip(json.dumps(d["a"], sort_keys=True) if d["only_in"] != "b" else "(absent)", 50),
             _clip(json.dumps(d["b"], sort_keys=True) if d["only_in"] != "a" else "(absent)", 50)] for d in diffs]
    print(_table(rows, ["PART", "A", "B"]))
    if graph_diff:
        print("\ncanonical graph diff:")
        print("\n".join(graph_diff))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if not args.file.strip():
        raise CliError("export needs the name of the archive to write, e.g. "
                       "`neuron-compile cache export warm-cache.tar.gz`; got an empty FILE")
    dest = Path(args.file)
    if dest.is_dir() or not dest.name:
        raise CliError(f"{args.file} is a directory; give the archive's file name, e.g. "
                       f"{dest / 'neuron-compile-cache.tar.gz'}")
    store = _store(args)
    digests = [resolve_prefix(store, p) for p in args.keys] if args.keys else store.digests()
    try:
        exported, skipped = export_entries(store, digests, dest)
    except OSError as exc:
        raise CliError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except (ValueError, OverflowError) as exc:  # an entry tar can't represent; nothing was written
        raise CliError(f"cannot write {dest}: {exc}; run `neuron-compile cache verify` to find the entry") from None
    if args.json:
        _emit({"file": str(dest), "exported": exported, "skipped": skipped})
    else:
        for s in skipped:
            print(f"skipped corrupt entry {s['key'][:12]}: {s['reason']}", file=sys.stderr)
        print(f"Exported {len(exported)} entries to {dest}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    src = Path(args.file)
    if src.is_dir():
        raise CliError(f"{src} is a directory, not an archive: give the .tar.gz file that "
                       "`neuron-compile cache export` wrote")
    if not src.exists():
        raise CliError(f"{src}: no such file")
    if not src.is_file():
        raise CliError(f"{src} is not a regular file: give the .tar.gz file that `neuron-compile cache export` wrote")
    store = _writable_store(args)
    verifier = None
    if args.trust:
        print("WARNING: --trust: imported entries are NOT verified by recompiling them. Their kernels are Python "
              "code this machine will execute; import only archives from people you trust to run code here.",
              file=sys.stderr)
    else:
        from neuron_compile.rebuild import verify_by_recompiling

        verifier = verify_by_recompiling
    try:
        report = import_archive(store, src, verifier)
    except ArchiveError as exc:
        raise CliError(f"refusing {src}: {exc}; nothing imported") from None
    if args.json:
        _emit({"imported": report.imported, "skipped": report.skipped, "rejected": report.rejected,
               "unverified": report.unverified, "verified": not args.trust})
    else:
        for r in report.rejected:
            print(f"rejected {r['key'][:12]}: {r['reason']}", file=sys.stderr)
        for r in report.unverified:
            print(f"not imported {r['key'][:12]}: {r['reason']} (--trust imports it unverified)", file=sys.stderr)
        print(f"Imported {len(report.imported)} entries{'' if args.trust else ' (each verified by recompiling)'}, "
              f"skipped {len(report.skipped)} already present, rejected {len(report.rejected)}"
              + (f", not verifiable here {len(report.unverified)}" if report.unverified else ""))
    return 1 if report.rejected else 0


# ------------------------------------------------------------------------------------------------
# argparse wiring


_CACHE_DIR_HELP = "cache root (default: NEURON_COMPILE_CACHE_DIR, else $XDG_CACHE_HOME/neuron-compile)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: given before or after the verb, the value survives (a verb's default can't erase it).
    parser.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS, help=_CACHE_DIR_HELP)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    def verb(name: str, fn: Any, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_verb=fn, parser=p)
        p.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS, help=_CACHE_DIR_HELP)
        if json_flag:
            p.add_argument("--json", action="store_true", help="machine-readable output (see docs/cache.md)")
        return p

    verb("path", cmd_path, "print the cache directory", json_flag=False)
    p = verb("list", cmd_list, "list entries: key prefix, graph, inputs, kernels, size, last use")
    p.add_argument("--sort", choices=sorted(_SORTS), default="last-used", help="order (default: last-used)")
    p = verb("show", cmd_show, "show one entry: manifest, key parts, files")
    p.add_argument("key", metavar="KEY_PREFIX")
    p.add_argument("--source", action="store_true", help="also print the kernel sources and other text files")
    p = verb("stats", cmd_stats, "hits, misses, compile time saved, size")
    p.add_argument("--zero", action="store_true", help="reset the statistics")
    p = verb("verify", cmd_verify, "check every entry's content hashes; exit 1 if bad entries remain")
    p.add_argument("--quarantine", action="store_true", help="move bad entries to quarantine/")
    p.add_argument("--recompile", action="store_true", help="also recompile each entry's stored graph and compare "
                   "the artifacts byte for byte (catches edited kernels whose manifest hashes were recomputed)")
    p = verb("prune", cmd_prune, "remove least recently used entries")
    p.add_argument("--max-size", type=parse_size, metavar="SIZE", help="shrink to at most SIZE (e.g. 500M, 2G)")
    p.add_argument("--older-than", type=parse_age, metavar="AGE", help="remove entries unused for AGE (e.g. 7d, 12h)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p = verb("clear", cmd_clear, "remove every entry (statistics are kept; see stats --zero)")
    p.add_argument("--yes", "-y", action="store_true", help="don't ask for confirmation")
    p = verb("diff", cmd_diff, "which key parts differ between two entries (why did it recompile?)")
    p.add_argument("key_a", metavar="KEY_A")
    p.add_argument("key_b", metavar="KEY_B")
    p = verb("export", cmd_export, "write entries to a tar.gz archive")
    p.add_argument("file", metavar="FILE")
    p.add_argument("keys", metavar="KEY_PREFIX", nargs="*", help="entries to export (default: all)")
    p = verb("import", cmd_import, "import entries from a tar.gz archive (each verified by recompiling it; "
             "existing ones skipped)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--trust", action="store_true", help="skip the recompile-and-compare verification (kernels "
                   "are executed code: only for archives from people you trust)")


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_verb", None)
    if fn is None:
        print("usage: neuron-compile cache {path,list,show,stats,verify,prune,clear,diff,export,import} ...\n"
              "neuron-compile cache: error: a VERB is required", file=sys.stderr)
        return 2
    try:
        bool(config.cache)  # a bad NEURON_COMPILE_CACHE fails every verb alike, before any output
        return int(fn(args))
    except (CliError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `neuron-compile cache list | head`
        return 0
    except OSError as exc:  # a file system refusal no verb anticipated: still one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # parser.error() for a usage mistake argparse can't express
        return int(exc.code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``neuron-compile cache`` on its own (same as ``neuron-compile cache ARGS``)."""
    parser = argparse.ArgumentParser(prog="neuron-compile cache", description="manage the artifact cache")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return run(args)
