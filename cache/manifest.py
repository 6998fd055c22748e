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
    """Parse and shape-check ``entry_dir/manifest.json`` (raises :class:`CorruptEntry`).

    Besides the required fields, the optional ones readers rely on (``summary``, ``graph_text``, the
    ``inputs`` and ``graph`` key parts) must have the types the cache writes, ``created`` must be a
    plausible time and the JSON must not nest absurdly deep: such a manifest is corrupt, not a crash later.
    """
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
    except RecursionError:  # `[[[[...]]]]`: the C decoder gives up at the interpreter's recursion limit
        raise CorruptEntry(f"manifest.json is nested too deeply to read ({len(raw)} bytes)") from None
    if not isinstance(manifest, dict):
        raise CorruptEntry("manifest.json is not a JSON object")
    if _nesting_exceeds(manifest, MAX_NESTING):
        raise CorruptEntry(f"manifest.json is nested more than {MAX_NESTING} levels deep")
    for field, kind in (("key", str), ("key_parts", dict), ("files", dict), ("created", (int, float))):
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise CorruptEntry(f"manifest.json lacks a valid '{field}' field")
    _check_field_shapes(manifest)
    for name, meta in manifest["files"].items():
        try:
            check_file_name(name)
        except ValueError as exc:
            raise CorruptEntry(f"manifest.json lists a bad file name: {exc}") from None
        if not (isinstance(meta, dict) and isinstance(meta.get("size"), int) and isinstance(meta.get("sha256"), str)):
            raise CorruptEntry(f"manifest.json has no size/sha256 for {name!r}")
    return manifest


# Far deeper than any manifest the cache writes (key parts and summaries nest a handful of levels); a
# deeper one is garbage, and readers that walk it (``flatten_parts``, ``json.dumps``) would recurse.
MAX_NESTING = 64
# Unix seconds a manifest's ``created`` may hold: from the epoch to the end of year 9999, what
# ``time.localtime`` and a tar header (``export``) can represent everywhere.
_MAX_TIMESTAMP = 253402300799.0


def _nesting_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists/objects more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _check_field_shapes(manifest: dict[str, Any]) -> None:
    """The optional fields readers use must have the types the cache writes (raises :class:`CorruptEntry`).

    ``compile_seconds`` is deliberately not checked: a bad value only loses a statistic (readers treat
    it as unknown), so the entry stays usable.
    """
    created = manifest["created"]
    if not 0 <= created <= _MAX_TIMESTAMP:  # also false for NaN; no float() of a huge int
        raise CorruptEntry(f"manifest.json has an impossible 'created' time ({created!r}); expected Unix seconds")
    for field, kind, expected in (("summary", dict, "an object"), ("graph_text", str, "a string")):
        value = manifest.get(field)
        if value is not None and not isinstance(value, kind):
            raise CorruptEntry(f"manifest.json's '{field}' is a {_json_type(value)}, expected {expected}")
    parts = manifest["key_parts"]
    inputs = parts.get("inputs")
    if inputs is not None:
        if not isinstance(inputs, list):
            raise CorruptEntry(f"manifest.json's key part 'inputs' is a {_json_type(inputs)}, expected a list")
        for i, sig in enumerate(inputs):
            shape = sig.get("shape") if isinstance(sig, dict) else None
            if shape is not None and not isinstance(shape, list):
                raise CorruptEntry(f"manifest.json's key part 'inputs[{i}].shape' is a {_json_type(shape)}, "
                                   "expected a list")
    graph = parts.get("graph")
    if graph is not None and not isinstance(graph, dict):
        raise CorruptEntry(f"manifest.json's key part 'graph' is a {_json_type(graph)}, expected an object")
    ops = graph.get("ops") if isinstance(graph, dict) else None
    if ops is not None:
        if not isinstance(ops, dict):
            raise CorruptEntry(f"manifest.json's key part 'graph.ops' is a {_json_type(ops)}, expected an object "
                               "of op counts")
        for name, count in ops.items():
            if not isinstance(count, int) or isinstance(count, bool):
                raise CorruptEntry(f"manifest.json's key part 'graph.ops' counts {name!r} as {count!r}, "
                                   "expected an integer")


def _json_type(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


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
