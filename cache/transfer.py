"""Carrying a warm cache between machines: ``export`` and ``import`` of tar.gz archives, plus entry info.

Owns the archive format (``entries/<digest>/manifest.json`` and the entry's files, nothing else)
and the import checks: every member must be a plain file or folder under ``entries/<64 hex>/``
(absolute paths, ``..``, links and devices make the whole archive refused before anything is
written); every entry is verified (file hashes, and the digest re-derived from its key parts) in
``tmp/`` before being published with ``os.replace``; entries already present are skipped.
Also owns :func:`entry_info`, the readable summary of an entry shared by ``list``/``show``/``export``.
"""

from __future__ import annotations

import io
import json
import logging
import lzma
import os
import re
import shutil
import tarfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_compile.cache.manifest import (
    MANIFEST,
    CorruptEntry,
    dir_size,
    last_used,
    read_manifest,
    verify_entry,
)
from neuron_compile.cache.store import CacheStore

log = logging.getLogger(__name__)

_MEMBER = re.compile(r"^entries(?:/([0-9a-f]{64})(?:/(.+))?)?/?$")


class ArchiveError(Exception):
    """The archive can't be read or contains an unsafe member; nothing was imported."""


@dataclass
class ImportReport:
    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    unverified: list[dict[str, str]] = field(default_factory=list)


def _short_dtype(dtype: object) -> str:
    names = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
             "int32": "i32", "bool": "bool", "int8": "i8", "uint8": "u8"}
    return names.get(str(dtype), str(dtype))


def input_labels(parts: dict[str, Any]) -> list[str]:
    """``["f32[2,3]", "int=4"]``: one short label per graph input."""
    labels = []
    for sig in parts.get("inputs") or []:
        if not isinstance(sig, dict):
            continue
        if sig.get("kind") == "tensor":
            shape = ",".join(str(d) for d in sig.get("shape") or [])
            labels.append(f"{_short_dtype(sig.get('dtype'))}[{shape}]" + ("*" if sig.get("requires_grad") else ""))
        elif "value" in sig:
            labels.append(f"{sig.get('kind')}={sig['value']}")
        else:
            labels.append(str(sig.get("kind")))
    return labels


def kernel_names(manifest: dict[str, Any]) -> list[str]:
    """Kernel names from the backend's summary (``kernels``: names or dicts with ``name``), else ``kernels/*``."""
    summary = manifest.get("summary") if isinstance(manifest.get("summary"), dict) else {}
    kernels = summary.get("kernels")
    if isinstance(kernels, list):
        return [str(k.get("name", "?")) if isinstance(k, dict) else str(k) for k in kernels]
    return [Path(n).stem for n in sorted(manifest.get("files", {})) if n.startswith("kernels/")]


def _function_label(parts: dict[str, Any]) -> str | None:
    """``Net.forward (model.py:12)`` for a Dynamo package (kind ``dynamo-frame``), else None."""
    fn = parts.get("function")
    if not isinstance(fn, dict):
        return None
    return f"{fn.get('qualname')} ({fn.get('file')}:{fn.get('line')})"


def entry_info(store: CacheStore, digest: str) -> dict[str, Any]:
    """Readable facts about an entry (no file hashing: ``verify`` does that). ``valid`` is False when
    the manifest itself is unreadable."""
    path = store.entry_path(digest)
    try:
        manifest = read_manifest(path)
    except CorruptEntry as exc:
        return {"key": digest, "valid": False, "problem": exc.reason, "path": str(path), "size": dir_size(path),
                "last_used": last_used(path), "created": None, "kind": None, "graph": {}, "inputs": [],
                "kernels": [], "files": 0, "compile_seconds": None}
    parts = manifest["key_parts"]
    graph = parts.get("graph") if isinstance(parts.get("graph"), dict) else {}
    return {
        "key": digest,
        "valid": True,
        "path": str(path),
        "kind": parts.get("kind"),
        "target": parts.get("target"),
        "graph": {"nodes": graph.get("nodes"), "ops": graph.get("ops", {})},
        "function": _function_label(parts),
        "inputs": input_labels(parts),
        "kernels": kernel_names(manifest),
        "files": len(manifest["files"]),
        "size": dir_size(path),
        "created": manifest["created"],
        "last_used": last_used(path),
        "compile_seconds": manifest.get("compile_seconds"),
    }


def export_entries(store: CacheStore, digests: list[str], dest: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Write the verified ones of ``digests`` to a tar.gz at ``dest`` (atomically); return (exported, skipped)."""
    exported: list[str] = []
    skipped: list[dict[str, str]] = []
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for digest in digests:
                path = store.entry_path(digest)
                try:
                    manifest, data = verify_entry(path, digest)
                except CorruptEntry as exc:
                    skipped.append({"key": digest, "reason": exc.reason})
                    continue
                _add_entry(tar, digest, manifest, (path / MANIFEST).read_bytes(), data)
                exported.append(digest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return exported, skipped


# what reading a truncated or corrupt gzip/bz2/xz stream raises besides tarfile.TarError
_STREAM_ERRORS: tuple[type[Exception], ...] = (EOFError, zlib.error, lzma.LZMAError)


def _scan(tar: tarfile.TarFile) -> dict[str, list[tuple[str, tarfile.TarInfo]]]:
    groups: dict[str, list[tuple[str, tarfile.TarInfo]]] = {}
    for member in tar.getmembers():
        name = member.name[2:] if member.name.startswith("./") else member.name
        match = _MEMBER.match(name)
        rel = match.group(2) if match else None
        if name.startswith("/") or "\\" in name or any(p in (".", "..") for p in name.split("/")) \
                or (rel is not None and "" in rel.split("/")):
            raise ArchiveError(f"member {member.name!r} is outside entries/<key>/ or escapes it (path traversal)")
        if not match:
            raise ArchiveError(f"member {member.name!r} is not entries/<key>/<file> (a key is 64 lower-case hex "
                               f"digits); is this a neuron-compile cache export?")
        if not (member.isfile() or member.isdir()):
            raise ArchiveError(f"member {member.name!r} is a link or special file; only files and folders are accepted")
        if match.group(1) and member.isfile():
            if rel is None:
                raise ArchiveError(f"member {member.name!r}: an entry must be a folder")
            groups.setdefault(match.group(1), []).append((rel, member))
        elif match.group(1):
            groups.setdefault(match.group(1), [])
    return groups


Verifier = Callable[[dict[str, Any], dict[str, bytes]], None]
_MAX_MANIFEST = 64 << 20


class _Rejected(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _manifest_member(tar: tarfile.TarFile, members: list[tuple[str, tarfile.TarInfo]]) -> dict[str, Any]:
    """The entry's manifest, read from the archive before anything is extracted."""
    found = [m for rel, m in members if rel == MANIFEST]
    if not found:
        raise _Rejected("manifest.json is missing")
    if found[0].size > _MAX_MANIFEST:
        raise _Rejected(f"manifest.json is {found[0].size} bytes")
    src = tar.extractfile(found[0])
    if src is None:
        raise _Rejected("manifest.json has no data")
    try:
        manifest = json.loads(src.read())
    except (ValueError, UnicodeDecodeError):
        raise _Rejected("manifest.json is not valid JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise _Rejected("manifest.json lacks a valid 'files' field")
    return manifest


def _check_members(manifest: dict[str, Any], members: list[tuple[str, tarfile.TarInfo]]) -> None:
    """Every member is listed with its size (a file the manifest doesn't list is never extracted)."""
    listed = manifest["files"]
    seen: set[str] = set()
    for rel, member in members:
        if rel in seen:  # tar keeps both; which one a reader gets is up to the reader
            raise _Rejected(f"file {rel!r} appears more than once in the archive")
        seen.add(rel)
        if rel == MANIFEST:
            continue
        meta = listed.get(rel)
        if not isinstance(meta, dict):
            raise _Rejected(f"file {rel!r} ({member.size} bytes) is not listed in manifest.json")
        if meta.get("size") != member.size:
            raise _Rejected(f"file {rel!r} is {member.size} bytes, manifest says {meta.get('size')}")


def entry_archive(store: CacheStore, digest: str) -> bytes:
    """One verified entry as an in-memory tar.gz (the remote tier's value format). Raises CorruptEntry."""
    path = store.entry_path(digest)
    manifest, data = verify_entry(path, digest)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        _add_entry(tar, digest, manifest, (path / MANIFEST).read_bytes(), data)
    return buf.getvalue()


def _add_entry(tar: tarfile.TarFile, digest: str, manifest: dict[str, Any], manifest_bytes: bytes,
               data: dict[str, bytes]) -> None:
    for name, blob in [(MANIFEST, manifest_bytes), *sorted(data.items())]:
        info = tarfile.TarInfo(f"entries/{digest}/{name}")
        info.size = len(blob)
        info.mtime = int(manifest["created"])
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(blob))


def import_archive(store: CacheStore, archive: Path | bytes, verifier: Verifier | None = None) -> ImportReport:
    """Import every valid entry of ``archive`` not already present. Raises :class:`ArchiveError`.

    ``verifier(manifest, files)`` (the recompile-and-compare check; None with ``--trust``) raises
    to refuse an entry; a refused entry is moved to ``quarantine/`` with a one-line WARNING, except
    an entry that merely can't be verified here (listed in ``report.unverified``, not imported).
    """
    what = "the archive" if isinstance(archive, bytes) else str(archive)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") if isinstance(archive, bytes) \
            else tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError, *_STREAM_ERRORS) as exc:
        raise ArchiveError(f"cannot read {what}: {exc}") from None
    report = ImportReport()
    with tar:
        try:
            groups = _scan(tar)
        except (tarfile.TarError, *_STREAM_ERRORS) as exc:  # a truncated or garbled compressed stream
            raise ArchiveError(f"cannot read {what}: {type(exc).__name__}: {exc}") from None
        for digest, members in sorted(groups.items()):
            if os.path.lexists(store.entry_path(digest)):
                report.skipped.append(digest)
                continue
            tmp = store.root / "tmp" / f"{digest[:16]}.import.{uuid.uuid4().hex[:8]}"
            try:
                manifest = _manifest_member(tar, members)
                _check_members(manifest, members)
                os.mkdir(tmp)
                for rel, member in members:
                    src = tar.extractfile(member)
                    if src is None:
                        raise CorruptEntry(f"member {rel!r} has no data")
                    dest = tmp / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with src, open(dest, "xb") as out:
                        shutil.copyfileobj(src, out)
                manifest, data = verify_entry(tmp, digest, check_parts=True)
                if verifier is not None:
                    verifier(manifest, data)
                os.replace(tmp, store.entry_path(digest))
                report.imported.append(digest)
            except (_Rejected, CorruptEntry) as exc:
                report.rejected.append({"key": digest, "reason": exc.reason})
                _quarantine_import(store, tmp, digest, exc.reason)
            except Exception as exc:
                reason = getattr(exc, "reason", None)
                if reason is None:
                    if isinstance(exc, OSError):
                        if os.path.lexists(store.entry_path(digest)):
                            report.skipped.append(digest)  # published concurrently
                        else:
                            report.rejected.append({"key": digest, "reason": f"cannot write: {exc.strerror or exc}"})
                        continue
                    if isinstance(exc, (tarfile.TarError, *_STREAM_ERRORS)):
                        report.rejected.append({"key": digest, "reason": f"archive data unreadable: {exc}"})
                        continue
                    reason = f"verification failed ({type(exc).__name__}: {exc})"
                if getattr(exc, "unverifiable", False):
                    report.unverified.append({"key": digest, "reason": reason})
                else:
                    report.rejected.append({"key": digest, "reason": reason})
                    _quarantine_import(store, tmp, digest, reason)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return report


def _quarantine_import(store: CacheStore, tmp: Path, digest: str, reason: str) -> None:
    """Keep a refused entry for inspection under ``quarantine/`` and say so in one line."""
    dest = store.root / "quarantine" / f"{digest}.{int(time.time())}.{uuid.uuid4().hex[:6]}"
    moved = False
    if tmp.is_dir():
        try:
            os.replace(tmp, dest)
            moved = True
        except OSError:
            pass
    log.warning("neuron-compile cache: refused imported entry %s (%s)%s", digest[:12], reason,
                f"; kept in {dest}" if moved else "")
