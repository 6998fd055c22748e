"""The on-disk artifact store: lookup, atomic publish, per-key locking, quarantine.

Owns :class:`CacheStore`, :class:`CacheEntry` and :func:`get_or_compile`, the one call the backend
makes. Layout under the root (default ``$XDG_CACHE_HOME/neuron-compile``)::

    CACHEDIR.TAG              marks the folder as a cache for backup tools
    entries/<digest>/         manifest.json + the artifact files (kernels/*.py, plan.json, ...)
    tmp/                      entries being written; published with one os.replace
    locks/<digest>.lock       per-key flock (see neuron_compile.cache.lock)
    quarantine/<digest>.<t>/  entries that failed their integrity check, kept for inspection
    stats.jsonl               append-only statistics (see neuron_compile.cache.stats)

Failure policy: the cache never makes a compile fail. Corrupt entries are quarantined with a
WARNING and recompiled; an unusable root (disabled, not creatable, read-only, full, writable by
other users without ``cache_allow_shared``) means compiling without the cache after one WARNING per
process; exceptions raised by ``compile_fn`` itself propagate unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import pwd
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from neuron_compile.cache import stats
from neuron_compile.cache.key import CacheKey
from neuron_compile.cache.lock import KeyLock, LockTimeout, UnsafeLockFile, describe_holder
from neuron_compile.cache.manifest import (
    MANIFEST,
    REQUIRED_FILES,
    CorruptEntry,
    build_manifest,
    check_file_name,
    read_manifest,
    verify_entry,
)

from neuron_compile.config import config
from neuron_compile.errors import ConfigError

log = logging.getLogger(__name__)

CompileFn = Callable[[], tuple[Mapping[str, bytes], Mapping[str, object]]]

_CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                 "# This file is a cache directory tag created by neuron-compile.\n"
                 "# For information about cache directory tags see https://bford.info/cachedir/\n")
_SUBDIRS = ("entries", "tmp", "locks", "quarantine")

# Set by neuron_compile.cache.remote on import: builds the remote tier for NEURON_COMPILE_REMOTE_CACHE.
REMOTE_FACTORY: Callable[[str, CacheStore], Any] | None = None

_warned: set[str] = set()
_warn_lock = threading.Lock()
_defaults: dict[tuple[str, bool], CacheStore | None] = {}


def warn_once(tag: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``tag`` is seen in this process (DEBUG afterwards)."""
    with _warn_lock:
        first = tag not in _warned
        _warned.add(tag)
    log.log(logging.WARNING if first else logging.DEBUG, message, *args)


def reset_process_state() -> None:
    """Forget memoized default stores and issued warnings (for tests and long-lived tools)."""
    with _warn_lock:
        _warned.clear()
        _defaults.clear()


def cache_settings() -> dict[str, Any]:
    """Every cache knob, read once; a malformed environment value raises ``ConfigError`` (one line)."""
    return {name: getattr(config, name) for name in ("cache", "cache_dir", "cache_lock_timeout", "cache_allow_shared",
                                                     "remote_cache", "remote_cache_timeout", "remote_cache_secret")}


def cache_enabled() -> bool:
    """``config.cache``, with a malformed NEURON_COMPILE_CACHE reported once (WARNING) as disabled."""
    try:
        return bool(config.cache)
    except ConfigError as exc:
        warn_once(f"config:{exc}", "neuron-compile cache disabled: %s", exc)
        return False


def default_root() -> Path:
    """``config.cache_dir``, else ``$XDG_CACHE_HOME/neuron-compile``, else ``~/.cache/neuron-compile``."""
    configured = config.cache_dir
    if configured:
        return Path(os.path.abspath(os.path.expanduser(configured)))
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".cache"
    return Path(os.path.abspath(base / "neuron-compile"))


def _is_private_group(gid: int, uid: int) -> bool:
    """A user-private group (same name as the user, no other members) may be group-writable safely."""
    try:
        import grp

        group = grp.getgrgid(gid)
        user = pwd.getpwuid(uid)
    except (KeyError, ImportError):
        return False
    return group.gr_name == user.pw_name and not [m for m in group.gr_mem if m != user.pw_name]


def _permission_problem(path: Path, st: os.stat_result, uid: int) -> str | None:
    if st.st_uid != uid:
        return (f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}); cache entries hold code "
                "that is executed, so a cache other users control is refused. Use your own "
                "NEURON_COMPILE_CACHE_DIR, or set NEURON_COMPILE_CACHE_ALLOW_SHARED=1 for a team cache")
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _is_private_group(st.st_gid, uid)):
        return (f"{path} is writable by other users (mode {stat.filemode(st.st_mode)}); cache entries "
                f"hold code that is executed, so it is refused. Fix with `chmod go-w {path}`, or set "
                "NEURON_COMPILE_CACHE_ALLOW_SHARED=1 for a deliberately shared team cache")
    return None


def inspect_root(root: Path, *, allow_shared: bool, create: bool = True) -> tuple[str | None, str | None]:
    """``(problem, write_problem)`` of a cache root.

    ``problem``: why the root can't be used at all (not creatable, not a folder, a subfolder that is
    a symlink or a file, a folder other users control). ``write_problem``: why nothing can be added
    (read-only, full disk) while existing entries stay usable. With ``create``, makes the folders.
    """
    try:
        if create:
            fresh = not root.exists()
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            for sub in _SUBDIRS:
                if not os.path.lexists(root / sub):
                    with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                        (root / sub).mkdir()
            if fresh or not (root / "CACHEDIR.TAG").exists():
                (root / "CACHEDIR.TAG").write_text(_CACHEDIR_TAG)
        elif not root.is_dir():
            return f"{root} does not exist", None
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES) and _has_layout(root):
            return None, f"the cache directory {root} is not writable: {exc.strerror or exc}"
        return f"cannot create the cache directory {root}: {exc.strerror or exc}", None
    if not root.is_dir():
        return f"{root} is not a directory", None
    uid = os.geteuid()
    for path in (root, *(root / sub for sub in _SUBDIRS)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot inspect {path}: {exc.strerror or exc}", None
        if path != root and stat.S_ISLNK(st.st_mode):
            return (f"{path} is a symbolic link; the cache's own folders must be real folders (a link could "
                    f"redirect writes outside the cache). Remove it: `rm {path}`"), None
        if path != root and not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a folder; remove it (`rm {path}`) and the cache recreates it", None
        if not allow_shared:
            problem = _permission_problem(path, st, uid)
            if problem:
                return problem, None
    if create:
        probe = root / "tmp" / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        created = False
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            created = True
            try:
                os.write(fd, b"ok" * 2048)  # a few KiB: a full disk refuses this, not only the inode
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return None, f"the cache directory {root} is not writable: {exc.strerror or exc}"
        finally:
            if created:
                with contextlib.suppress(OSError):
                    os.unlink(probe)
    return None, None


def _has_layout(root: Path) -> bool:
    return (root / "entries").is_dir()


def check_root(root: Path, *, allow_shared: bool, create: bool = True) -> str | None:
    """Why ``root`` can't hold (or accept new) cache entries, or None. With ``create``, makes its folders."""
    problem, write_problem = inspect_root(root, allow_shared=allow_shared, create=create)
    return problem or write_problem


class CacheEntry:
    """A verified cache entry: ``key`` (digest), ``path`` (its folder), ``manifest``."""

    def __init__(self, key: str, path: Path, manifest: dict[str, Any], data: dict[str, bytes] | None = None,
                 origin: str = "local") -> None:
        self.key = key
        self.path = path
        self.manifest = manifest
        self._data = data
        self.origin = origin  # "local", or "remote" when it was just fetched from the remote tier

    def names(self) -> list[str]:
        return sorted(self.manifest["files"])

    def read(self, name: str) -> bytes:
        """Contents of artifact ``name`` (verified against the manifest's hash)."""
        if self._data is not None and name in self._data:
            return self._data[name]
        if name not in self.manifest["files"]:
            raise KeyError(f"cache entry {self.key[:12]} has no file {name!r}; it has: {', '.join(self.names())}")
        _, self._data = verify_entry(self.path, self.key)
        return self._data[name]

    def files(self) -> dict[str, bytes]:
        if self._data is None:
            _, self._data = verify_entry(self.path, self.key)
        return dict(self._data)

    def __repr__(self) -> str:
        return f"CacheEntry({self.key[:12]}…, {len(self.manifest['files'])} files, {self.path})"


class CacheStore:
    """A cache root. Build it with :meth:`default` (checked) or ``CacheStore(root)`` (tools, tests)."""

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        self.root = Path(root)
        self._write_disabled = read_only
        self.remote: Any = None  # a RemoteTier (neuron_compile.cache.remote) when one is configured

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def default(cls) -> CacheStore | None:
        """The configured store, or None when disabled or unusable (one WARNING per process).

        A root that exists but can't take new entries (read-only, full disk) is used read-only.
        """
        try:
            settings = cache_settings()
        except ConfigError as exc:
            warn_once(f"config:{exc}", "neuron-compile cache disabled: %s", exc)
            return None
        if not settings["cache"]:
            log.debug("neuron-compile cache disabled (NEURON_COMPILE_CACHE=0)")
            return None
        root = default_root()
        memo = (str(root), bool(settings["cache_allow_shared"]), settings["remote_cache"])
        if memo in _defaults:
            return _defaults[memo]
        problem, write_problem = inspect_root(root, allow_shared=memo[1])
        store = None if problem else cls(root, read_only=write_problem is not None)
        if problem:
            warn_once(f"root:{root}", "neuron-compile cache disabled: %s", problem)
        elif write_problem:
            warn_once(f"root:{root}", "neuron-compile cache: %s; using its existing entries, adding none",
                      write_problem)
        if store is not None and settings["remote_cache"] and REMOTE_FACTORY is not None:
            store.remote = REMOTE_FACTORY(settings["remote_cache"], store)
        _defaults[memo] = store
        return store

    # -- paths ---------------------------------------------------------------------------------
    @property
    def entries_dir(self) -> Path:
        return self.root / "entries"

    def entry_path(self, digest: str) -> Path:
        return self.entries_dir / digest

    def digests(self) -> list[str]:
        """Digests of every entry folder present (valid or not), sorted."""
        try:
            names = os.listdir(self.entries_dir)
        except OSError:
            return []
        return sorted(n for n in names if len(n) == 64 and all(c in "0123456789abcdef" for c in n))

    # -- reading -------------------------------------------------------------------------------
    def lookup(self, key: CacheKey) -> CacheEntry | None:
        """The verified entry for ``key``; a corrupt one is quarantined (WARNING) and None returned."""
        entry = self.lookup_local(key)
        if entry is None and self.remote is not None:
            entry = self.remote.fetch(key)
        return entry

    def lookup_local(self, key: CacheKey) -> CacheEntry | None:
        """Like :meth:`lookup`, this root only."""
        path = self.entry_path(key.digest)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        try:
            if stat.S_ISLNK(st.st_mode):
                raise CorruptEntry("entries/<key> is a symbolic link, not a folder")
            if not stat.S_ISDIR(st.st_mode):
                raise CorruptEntry("entries/<key> is a file, not a folder")
            # the key parts must hash to the entry's name too: an entry moved or copied under another key would
            # otherwise serve another graph's kernels
            manifest, data = verify_entry(path, key.digest, check_parts=True)
        except CorruptEntry as exc:
            self.quarantine(key.digest, exc.reason)
            stats.record(self.root, "corrupt", key=key.digest[:16])
            return None
        try:
            now = time.time()  # explicit: the filesystem's coarse clock could order two uses wrongly
            os.utime(path / MANIFEST, (now, now))  # last use, for LRU pruning
        except OSError:
            pass
        return CacheEntry(key.digest, path, manifest, data)

    def quarantine(self, digest: str, reason: str) -> Path | None:
        """Move an entry aside to ``quarantine/`` with a WARNING; returns where it went."""
        src = self.entry_path(digest)
        dest = self.root / "quarantine" / f"{digest}.{int(time.time())}.{uuid.uuid4().hex[:6]}"
        try:
            dest.parent.mkdir(exist_ok=True)
            os.replace(src, dest)
        except FileNotFoundError:
            return None  # someone else moved or removed it first
        except OSError as exc:
            log.warning("neuron-compile cache: entry %s is corrupt (%s) and could not be moved aside (%s); "
                        "compiling without it", digest[:12], reason, exc.strerror or exc)
            return None
        log.warning("neuron-compile cache: entry %s is corrupt (%s); moved to %s and recompiling",
                    digest[:12], reason, dest)
        return dest

    # -- writing -------------------------------------------------------------------------------
    def publish(self, key: CacheKey, files: Mapping[str, bytes], summary: Mapping[str, object],
                compile_seconds: float) -> CacheEntry | None:
        """Write an entry into ``tmp/`` and ``os.replace`` it into place. Never raises on disk errors."""
        if self._write_disabled:
            return None
        try:
            for name, blob in files.items():
                check_file_name(name)
                if not isinstance(blob, (bytes, bytearray, memoryview)):
                    raise ValueError(f"artifact {name!r} is {type(blob).__name__}, expected bytes")
            files = {name: bytes(blob) for name, blob in files.items()}
            kind = key.parts.get("kind")
            missing = [n for n in REQUIRED_FILES.get(kind, ()) if n not in files] if isinstance(kind, str) else []
            if missing:
                raise ValueError(f"a {kind} entry needs {missing[0]!r}")
            manifest = build_manifest(key, files, summary, compile_seconds)
        except (ValueError, TypeError) as exc:
            log.warning("neuron-compile cache: not caching graph %s: %s", key.short, exc)
            return None
        final = self.entry_path(key.digest)
        if os.path.lexists(final) and not (final.is_dir() and not final.is_symlink()):
            self.quarantine(key.digest, "entries/<key> is a file or link, not a folder")
        tmp = self.root / "tmp" / f"{key.digest[:16]}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            os.mkdir(tmp)  # honours the umask (mkdtemp's 0700 would hide entries of a team cache)
            for name, blob in files.items():
                dest = tmp / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(blob)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.utime(tmp / MANIFEST, (manifest["created"], manifest["created"]))  # last use starts at creation
            try:
                os.replace(tmp, final)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process published it first
                return CacheEntry(key.digest, final, manifest, files)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self._write_disabled = True  # (set before the warning: a full disk stays full)
            stats.record(self.root, "write_error", key=key.digest[:16])
            warn_once(f"write:{self.root}", "neuron-compile cache: cannot write to %s (%s); compiling without "
                      "caching for the rest of this process", self.root, exc.strerror or exc)
            return None
        entry = CacheEntry(key.digest, final, manifest, files)
        if self.remote is not None:
            self.remote.publish(key, entry)  # write-behind: queued, sent by a background thread
        return entry

    def remove(self, digest: str) -> bool:
        """Delete an entry: renamed into ``tmp/`` first, so readers never see it half-removed."""
        return self.remove_reason(digest) is None

    def remove_reason(self, digest: str) -> str | None:
        """:meth:`remove`, returning None on success or why the entry could not be removed."""
        src = self.entry_path(digest)
        doomed = self.root / "tmp" / f"{digest[:16]}.deleting.{uuid.uuid4().hex[:8]}"
        try:
            os.replace(src, doomed)
        except FileNotFoundError:
            return None  # removed concurrently
        except OSError as exc:
            return str(exc.strerror or exc)
        shutil.rmtree(doomed, ignore_errors=True)
        return None

    # -- the backend's entry point ---------------------------------------------------------------
    def get_or_compile(self, key: CacheKey, compile_fn: CompileFn) -> tuple[dict[str, bytes], bool]:
        """``(files, hit)``: a verified entry, or ``compile_fn()`` run under the per-key lock and published."""
        start = time.perf_counter()
        entry = self._try(self.lookup, key)
        if entry is not None:
            return self._hit(entry, start), True
        lock: KeyLock | None = KeyLock(self.root / "locks" / f"{key.digest}.lock")
        try:
            timeout = float(config.cache_lock_timeout)
        except ConfigError as exc:
            warn_once(f"config:{exc}", "neuron-compile cache: %s; not waiting for other processes", exc)
            timeout = 0.0
        try:
            lock.acquire(timeout)
        except LockTimeout as exc:
            stats.record(self.root, "lock_timeout", key=key.digest[:16])
            log.warning("neuron-compile cache: waited %.1f s for %s compiling graph %s; compiling without "
                        "waiting (NEURON_COMPILE_CACHE_LOCK_TIMEOUT=%g)", exc.waited, describe_holder(exc.holder),
                        key.short, timeout)
            lock = None
        except UnsafeLockFile as exc:
            warn_once(f"lockfile:{self.root}", "neuron-compile cache: refusing the lock file %s (%s); compiling "
                      "without the lock. Remove it if you did not put it there", exc.filename or "", exc.strerror)
            lock = None
        except Exception as exc:  # no locks on this filesystem, locks/ removed, ...: still correct, may compile twice
            log.debug("neuron-compile cache: no lock for %s: %s", key.short, exc)
            lock = None
        try:
            if lock is not None:  # another local process may have published it meanwhile
                entry = self._try(self.lookup_local, key)
                if entry is not None:
                    return self._hit(entry, start), True
            t0 = time.perf_counter()
            files, summary = compile_fn()
            seconds = time.perf_counter() - t0
            published = self._try(self.publish, key, files, summary, seconds)
            size = sum(len(b) for b in files.values()) if published is not None else 0
            stats.record(self.root, "miss", key=key.digest[:16], compile=round(seconds, 6), bytes=size)
            return dict(files), False
        finally:
            if lock is not None:
                lock.release()

    def _hit(self, entry: CacheEntry, start: float, **fields: object) -> dict[str, bytes]:
        self.record_hit(entry, start, **fields)
        return entry.files()

    def record_hit(self, entry: CacheEntry, start: float, **fields: object) -> None:
        """Count a hit in ``stats.jsonl`` (``whole_graph=True`` for a whole Dynamo graph served at once)."""
        load = time.perf_counter() - start
        origin = entry.origin
        try:
            saved = float(entry.manifest.get("compile_seconds", 0.0))
        except (TypeError, ValueError):  # a hand-edited manifest: the hit is still a hit
            saved = 0.0
        stats.record(self.root, "hit", key=entry.key[:16], saved=saved if math.isfinite(saved) else 0.0,
                     load=round(load, 6), **({"origin": origin} if origin != "local" else {}), **fields)
        log.debug("neuron-compile cache hit %s (%.1f ms)", entry.key[:12], load * 1e3)

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # the cache must never fail a compile
            warn_once(f"error:{self.root}", "neuron-compile cache: internal error in %s (%s: %s); compiling "
                      "without the cache", fn.__name__, type(exc).__name__, exc)
            return None


def get_or_compile(key: CacheKey, compile_fn: CompileFn) -> tuple[dict[str, bytes], bool]:
    """Module-level convenience: the default store, or a plain compile when there is none."""
    store = CacheStore.default()
    if store is None:
        return dict(compile_fn()[0]), False
    return store.get_or_compile(key, compile_fn)


def entry_manifest(store: CacheStore, digest: str) -> dict[str, Any] | None:
    """The manifest of an entry without verifying its files (listing); None when unreadable."""
    try:
        return read_manifest(store.entry_path(digest))
    except CorruptEntry:
        return None
