"""Entry manifests: what an entry holds and how to check it.

Owns the ``manifest.json`` format (built by :func:`build_manifest`, checked by
:func:`verify_entry`) and the rules for artifact file names (:func:`check_file_name`). A manifest
records the key digest and every key part in readable form, the summary the backend passed, the
canonical graph text, creation/last-use times, compile time, and the size and sha256 of each file.

:func:`verify_entry` is the one integrity check used by lookups, ``verify`` and ``import``: it
raises :class:`CorruptEntry` with a one-line reason (missing or garbage manifest, digest mismatch,
missing, truncated or garbled file, a file present but not listed, a symlink or special file, a
file its kind requires missing from the manifest). The manifest lists exactly the files present.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuron_compile.cache.key import SCHEMA_VERSION, CacheKey, digest_of

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_RESERVED = {MANIFEST}
# Files an entry of these kinds cannot work without (the backend's runner plan).
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    **{kind: ("plan.json",) for kind in ("forward", "backward", "inference")},
    **{kind: ("aot_autograd.pkl", "children.json") for kind in ("dynamo-inference", "dynamo-train")},
    "dynamo-frame": ("dynamo_frame.pkl", "backends.json"),  # a Dynamo package (neuron_compile.warm_frames)
}


class CorruptEntry(Exception):
    """An entry failed its integrity check; ``reason`` says how, in one line."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def check_file_name(name: str) -> None:
    """Artifact names are relative POSIX paths without ``..``, empty parts or backslashes."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise ValueError(f"artifact name {name!r}: expected a relative POSIX path like 'kernels/k0.py'")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"artifact name {name!r}: '.', '..' and empty path parts are not allowed")
    if name in _RESERVED:
        raise ValueError(f"artifact name {name!r} is reserved for the cache's own manifest")


def build_manifest(key: CacheKey, files: Mapping[str, bytes], summary: Mapping[str, object],
                   compile_seconds: float) -> dict[str, Any]:
    now = time.time()
    entries = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
               for name, data in sorted(files.items())}
    return {
        "schema": SCHEMA_VERSION,
        "key": key.digest,
        "key_parts": key.parts,
        "graph_text": key.graph_text,
        "summary": json.loads(json.dumps(summary, default=str)),
        "created": now,
        "last_used": now,
        "compile_seconds": round(float(compile_seconds), 6),
        "files": entries,
        "total_bytes": sum(e["size"] for e in entries.values()),
    }


def read_manifest(entry_dir: Path) -> dict[str, Any]:
    """Parse and shape-check ``entry_dir/manifest.json`` (raises :class:`CorruptEntry`)."""
    path = entry_dir / MANIFEST
    try:
        raw = _read_nofollow(path)
    except FileNotFoundError:
        raise CorruptEntry("manifest.json is missing") from None
    except OSError as exc:
        raise CorruptEntry(f"manifest.json is unreadable ({exc.strerror})") from None
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CorruptEntry(f"manifest.json is not valid JSON ({len(raw)} bytes)") from None
    if not isinstance(manifest, dict):
        raise CorruptEntry("manifest.json is not a JSON object")
    for field, kind in (("key", str), ("key_parts", dict), ("files", dict), ("created", (int, float))):
        if not isinstance(manifest.get(field), kind):
            raise CorruptEntry(f"manifest.json lacks a valid '{field}' field")
    for name, meta in manifest["files"].items():
        try:
            check_file_name(name)
        except ValueError as exc:
            raise CorruptEntry(f"manifest.json lists a bad file name: {exc}") from None
        if not (isinstance(meta, dict) and isinstance(meta.get("size"), int) and isinstance(meta.get("sha256"), str)):
            raise CorruptEntry(f"manifest.json has no size/sha256 for {name!r}")
    return manifest


def verify_entry(entry_dir: Path, digest: str | None = None, *, check_parts: bool = False
                 ) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Check an entry end to end; return its manifest and verified file contents.

    ``digest`` (default: the folder name) must match the manifest's key; with ``check_parts`` the
    digest is also re-derived from the recorded key parts (``import`` does this: archives are
    untrusted).
    """
    digest = digest or entry_dir.name
    manifest = read_manifest(entry_dir)
    if manifest["key"] != digest:
        raise CorruptEntry(f"manifest.json names key {str(manifest['key'])[:16]}…, not {digest[:16]}…")
    if check_parts:
        try:
            derived = digest_of(manifest["key_parts"])
        except (TypeError, ValueError):
            raise CorruptEntry("key parts are not canonical JSON") from None
        if derived != digest:
            raise CorruptEntry(f"key parts hash to {derived[:16]}…, not to the entry's key {digest[:16]}…")
    kind = manifest["key_parts"].get("kind")
    for name in REQUIRED_FILES.get(kind, ()) if isinstance(kind, str) else ():
        if name not in manifest["files"]:
            raise CorruptEntry(f"manifest.json does not list {name!r}, which a {kind} entry needs")
    present = present_files(entry_dir)
    unlisted = sorted(set(present) - set(manifest["files"]) - {MANIFEST})
    if unlisted:
        raise CorruptEntry(f"file {unlisted[0]!r} ({present[unlisted[0]]} bytes) is not listed in manifest.json")
    data: dict[str, bytes] = {}
    for name, meta in manifest["files"].items():
        try:
            blob = _read_nofollow(entry_dir / name)
        except FileNotFoundError:
            raise CorruptEntry(f"file {name!r} is missing") from None
        except OSError as exc:
            raise CorruptEntry(f"file {name!r} is unreadable ({exc.strerror})") from None
        if len(blob) != meta["size"]:
            raise CorruptEntry(f"file {name!r} is {len(blob)} bytes, manifest says {meta['size']} (truncated?)")
        if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
            raise CorruptEntry(f"file {name!r} fails its content hash (garbled)")
        data[name] = blob
    return manifest, data


def _read_nofollow(path: Path) -> bytes:
    """A file's bytes; a symlink or special file in its place is a :class:`CorruptEntry`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptEntry(f"file {path.name!r} is a symbolic link; entries hold only plain files") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptEntry(f"file {path.name!r} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def present_files(entry_dir: Path) -> dict[str, int]:
    """``{relative POSIX name: size}`` of every file under ``entry_dir`` (links are not followed).

    Raises :class:`CorruptEntry` for a symlink or a special file anywhere in the entry.
    """
    found: dict[str, int] = {}
    for dirpath, dirs, names in os.walk(entry_dir, followlinks=False):
        for name in [*dirs, *names]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, entry_dir).replace(os.sep, "/")
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise CorruptEntry(f"{rel!r} is a symbolic link; entries hold only plain files")
            if stat.S_ISREG(st.st_mode):
                found[rel] = st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                raise CorruptEntry(f"{rel!r} is a special file; entries hold only plain files")
    return found


def last_used(entry_dir: Path) -> float:
    """Last use = the manifest's mtime: set at publish, bumped on every hit, what ``prune`` orders by."""
    try:
        return os.stat(entry_dir / MANIFEST).st_mtime
    except OSError:
        return 0.0


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
