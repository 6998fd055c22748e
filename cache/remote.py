"""The shared remote tier behind the local cache: Redis (``NEURON_COMPILE_REMOTE_CACHE=redis://host:port/db``).

Owns :class:`RemoteTier`. Read-through: a local miss asks the remote; a remote entry is checked,
imported into the local root (the same path and checks as ``cache import``) and served from there,
so the next use is a local hit. Write-behind: a freshly compiled entry is published from a
background thread (``SET NX``: the first publisher of a key wins, later ones are no-ops), flushed
at exit within the timeout.

Integrity: a remote value is the entry as a tar.gz (manifest + files), framed as
``NCRC1 <hmac-hex or "-"> <payload>``. With ``NEURON_COMPILE_REMOTE_CACHE_SECRET`` set, values are
signed with HMAC-SHA256 under it and a value with a missing or wrong signature is refused; without
it, an entry is verified by recompiling it the first time this host uses it (the verifier the
backend registers, see :func:`set_verifier`), and entries that can't be verified that way (whole
Dynamo graphs) are not used. A refused value is quarantined locally with a one-line WARNING.

Failures: every operation has a deadline (``NEURON_COMPILE_REMOTE_CACHE_TIMEOUT``); the first
connection error, timeout or protocol error logs one WARNING and turns the tier off for the rest of
the process (compiles continue with the local cache). Nothing here ever fails a compile.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from neuron_compile.cache import stats
from neuron_compile.cache import store as store_mod
from neuron_compile.cache.manifest import CorruptEntry
from neuron_compile.cache.resp import RedisClient, RedisError, RedisURL, parse_redis_url
from neuron_compile.cache.transfer import ArchiveError, entry_archive, import_archive

from neuron_compile.config import config

if TYPE_CHECKING:
    from neuron_compile.cache.key import CacheKey
    from neuron_compile.cache.store import CacheEntry, CacheStore

log = logging.getLogger(__name__)

MAGIC = b"NCRC1"
KEY_PREFIX = "neuron-compile:v1:"
_UNSIGNED = b"-"

Verifier = Callable[[dict[str, Any], dict[str, bytes]], None]
_verifier: list[Verifier] = []


def set_verifier(fn: Verifier) -> None:
    """Register the recompile-and-compare check used for unsigned remote entries (the backend does)."""
    _verifier[:] = [fn]


def sign(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest().encode()


def frame(payload: bytes, secret: str) -> bytes:
    return b" ".join((MAGIC, sign(secret, payload) if secret else _UNSIGNED, payload))


def unframe(value: bytes) -> tuple[bytes | None, bytes]:
    """``(signature or None, payload)``; raises ValueError for a value that is not ours."""
    magic, _, rest = value.partition(b" ")
    sig, _, payload = rest.partition(b" ")
    if magic != MAGIC or not payload:
        raise ValueError("not a neuron-compile entry")
    return (None if sig == _UNSIGNED else sig), payload


class RemoteTier:
    """One remote cache for one local store (built by :func:`make_remote`)."""

    def __init__(self, url: RedisURL, store: CacheStore, *, timeout: float, secret: str) -> None:
        self.url = url
        self.store = store
        self.timeout = timeout
        self.secret = secret
        self.disabled: str | None = None
        self._lock = threading.Lock()  # one connection, used by lookups and the publisher thread
        self._client = RedisClient(url, timeout)
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    # -- plumbing ---------------------------------------------------------------------------------
    def _fail(self, what: str, exc: Exception) -> None:
        stats.record(self.store.root, "remote_errors")
        if self.disabled is None:
            self.disabled = f"{what}: {exc}"
            log.warning("neuron-compile remote cache %s unavailable (%s %s); using the local cache only for the "
                        "rest of this process", self.url.redacted(), what, exc)
        self._client.close()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.disabled is not None:
            return None
        with self._lock:
            try:
                return fn()
            except RedisError as exc:
                self._fail(what, exc)
                return None
            except Exception as exc:  # noqa: BLE001 - a remote that misbehaves in any way never fails a compile
                self._fail(what, RedisError(f"{type(exc).__name__}: {exc}"[:300]))
                return None

    # -- read-through -----------------------------------------------------------------------------
    def fetch(self, key: CacheKey) -> CacheEntry | None:
        """The remote entry for ``key``, checked and copied into the local root; None otherwise."""
        if self.disabled is not None:
            return None
        value = self._call("GET", lambda: self._client.get(KEY_PREFIX + key.digest))
        if value is None:
            if self.disabled is None:
                stats.record(self.store.root, "remote_misses", key=key.digest[:16])
            return None
        reason = self._accept(key, value)
        if reason is not None:
            stats.record(self.store.root, "remote_rejected", key=key.digest[:16])
            if reason:
                log.warning("neuron-compile remote cache: refused entry %s from %s (%s)", key.short,
                            self.url.redacted(), reason)
            return None
        entry = self.store.lookup_local(key)
        if entry is not None:
            entry.origin = "remote"
            stats.record(self.store.root, "remote_hits", key=key.digest[:16], bytes=len(value))
        return entry

    def _accept(self, key: CacheKey, value: bytes) -> str | None:
        """Import ``value`` into the local root; None when imported, else why not ('' = silently)."""
        try:
            sig, payload = unframe(value)
        except ValueError as exc:
            return f"garbled value ({exc}, {len(value)} bytes)"
        verifier: Verifier | None
        if self.secret:
            if sig is None:
                return "unsigned, but NEURON_COMPILE_REMOTE_CACHE_SECRET is set"
            if not hmac.compare_digest(sig, sign(self.secret, payload)):
                return "bad signature: not published with this team's NEURON_COMPILE_REMOTE_CACHE_SECRET"
            verifier = None
        else:
            if not _verifier:
                return ""  # nothing can verify it in this process: not used, not an error
            verifier = _verifier[0]
        try:
            report = import_archive(self.store, payload, verifier)
        except ArchiveError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a bad value is refused, never a failed compile
            return f"unreadable value ({type(exc).__name__}: {exc})"[:300]
        if key.digest in report.imported or key.digest in report.skipped:
            return None
        for r in report.rejected:
            if r["key"] == key.digest:
                return ""  # import_archive already warned (and quarantined it)
        for r in report.unverified:
            if r["key"] == key.digest:
                log.debug("remote entry %s not used: %s", key.short, r["reason"])
                return ""
        return "the value holds no entry for this key"

    # -- write-behind -----------------------------------------------------------------------------
    def publish(self, key: CacheKey, entry: CacheEntry) -> None:
        """Queue ``entry`` for the remote (a background thread sends it; flushed at exit)."""
        if self.disabled is not None:
            return
        try:
            payload = entry_archive(self.store, key.digest)
        except (CorruptEntry, OSError) as exc:
            log.debug("not publishing %s remotely: %s", key.short, exc)
            return
        self._queue.put((key.digest, frame(payload, self.secret)))
        if self._thread is None:
            self._thread = threading.Thread(target=self._publisher, name="neuron-compile-remote-publish", daemon=True)
            self._thread.start()
            atexit.register(self.flush)

    def _publisher(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                digest, value = item
                stored = self._call("SET", lambda d=digest, v=value: self._client.set_nx(KEY_PREFIX + d, v))
                if stored:
                    stats.record(self.store.root, "remote_published", key=digest[:16], bytes=len(value))
            finally:
                self._queue.task_done()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued entries are sent (at most ``timeout``, default a few remote timeouts)."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + (timeout if timeout is not None else 4 * self.timeout)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks


CLAIM_PREFIX = "neuron-compile:v1:compiling:"


class Claim:
    """A cluster-wide claim on compiling one key (``SET NX EX`` on a token), for ``precompile``."""

    def __init__(self, tier: RemoteTier, digest: str, ttl: float) -> None:
        self.tier = tier
        self.key = CLAIM_PREFIX + digest
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}".encode()
        self.ttl = max(1, int(ttl))

    def acquire(self) -> bool | None:
        """True: ours to compile; False: another host is compiling it; None: the remote is unusable."""
        got = self.tier._call("SET", lambda: self.tier._client.set_nx(self.key, self.token, self.ttl))
        return None if got is None else bool(got)

    def release(self) -> None:
        def drop() -> None:
            if self.tier._client.get(self.key) == self.token:  # never another host's claim after ours expired
                self.tier._client.delete(self.key)

        self.tier._call("DEL", drop)


def wait_for_remote(tier: RemoteTier, key: CacheKey, timeout: float, poll: float = 0.25) -> CacheEntry | None:
    """Poll the remote until another host publishes ``key`` (or its claim disappears, or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and tier.disabled is None:
        published = tier._call("EXISTS", lambda: tier._client.call("EXISTS", KEY_PREFIX + key.digest))
        claimed = tier._call("GET", lambda: tier._client.get(CLAIM_PREFIX + key.digest))
        if published or claimed is None:  # published, or its holder gave up (then fetch() finds nothing)
            return tier.fetch(key)
        time.sleep(poll)
    return None


def make_remote(url: str, store: CacheStore) -> RemoteTier | None:
    """The tier for ``NEURON_COMPILE_REMOTE_CACHE``; a bad URL is one WARNING and no remote tier."""
    try:
        parsed = parse_redis_url(url)
    except ValueError as exc:
        store_mod.warn_once(f"remote-url:{exc}", "neuron-compile remote cache disabled: NEURON_COMPILE_REMOTE_CACHE=%s",
                            exc)  # the message holds the URL without its password
        return None
    return RemoteTier(parsed, store, timeout=float(config.remote_cache_timeout), secret=config.remote_cache_secret)


store_mod.REMOTE_FACTORY = make_remote
