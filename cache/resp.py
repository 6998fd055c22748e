"""A minimal Redis client: the few commands the remote cache tier needs, over RESP2.

Owns :class:`RedisClient` and :func:`parse_redis_url`. Why not the ``redis`` package: the tier
needs GET, SET (NX, EX), DEL, EXISTS, PING, AUTH and SELECT on one connection with a hard deadline on every
operation (connect, send and receive share one timeout), and nothing else; a dependency on every
host of a fleet for that is more to install and audit than these ~150 lines. ``rediss://`` uses
the standard library's TLS with certificate verification.

Every failure raises :class:`RedisError` (a subclass of ``OSError``) with a one-line message;
timeouts raise :class:`RedisTimeout`. Replies larger than ``max_reply`` bytes are refused before
they are read, so a hostile server can't make a client allocate without bound.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_REPLY = 1 << 30
_MAX_DEPTH = 8  # nesting of RESP arrays accepted in a reply
_MAX_ITEMS = 1 << 16  # items of one RESP array accepted in a reply


class RedisError(OSError):
    """A connection, protocol or server error (one line)."""


class RedisTimeout(RedisError):
    """The server did not answer within the deadline."""


@dataclass(frozen=True)
class RedisURL:
    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    tls: bool

    def redacted(self) -> str:
        """The URL without its password (for messages)."""
        scheme = "rediss" if self.tls else "redis"
        auth = f"{self.username or ''}:***@" if self.password else ""
        return f"{scheme}://{auth}{self.host}:{self.port}/{self.db}"


def parse_redis_url(url: str) -> RedisURL:
    """``redis://[user:password@]host[:port][/db]`` (or ``rediss://``); raises ValueError with the fix."""
    parsed = urllib.parse.urlsplit(url.strip())
    # messages show the URL without its password
    url = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url.strip()) if "@" in url else url
    if parsed.scheme not in ("redis", "rediss"):
        raise ValueError(f"{url!r}: expected redis://host:port/db (or rediss:// for TLS)")
    if not parsed.hostname:
        raise ValueError(f"{url!r}: no host; expected redis://host:port/db")
    try:
        port = parsed.port or 6379
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number in [1, 65535]") from None
    path = parsed.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"{url!r}: the database must be a number (redis://host:port/0)")
    db = int(path or 0)
    if db > 1 << 16:
        raise ValueError(f"{url!r}: database {db} out of range")
    return RedisURL(parsed.hostname, port, db, urllib.parse.unquote(parsed.username) if parsed.username else None,
                    urllib.parse.unquote(parsed.password) if parsed.password else None, parsed.scheme == "rediss")


def _encode(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class RedisClient:
    """One connection; every call finishes within ``timeout`` seconds or raises :class:`RedisTimeout`."""

    def __init__(self, url: RedisURL, timeout: float, max_reply: int = MAX_REPLY) -> None:
        self.url = url
        self.timeout = timeout
        self.max_reply = max_reply
        self._sock: socket.socket | None = None
        self._buf = b""
        self._deadline = 0.0

    # -- connection -------------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.url.host, self.url.port), timeout=self._remaining())
        except TimeoutError:
            raise RedisTimeout(f"connecting timed out after {self.timeout:g} s") from None
        except OSError as exc:
            raise RedisError(f"cannot connect ({exc.strerror or exc})") from None
        if self.url.tls:
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.url.host)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise RedisError(f"TLS handshake failed ({exc})") from None
        self._sock, self._buf = sock, b""
        if self.url.password:
            auth = (self.url.username, self.url.password) if self.url.username else (self.url.password,)
            self._call("AUTH", *auth)
        if self.url.db:
            self._call("SELECT", self.url.db)
        return sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise RedisTimeout(f"no answer within {self.timeout:g} s")
        return left

    # -- protocol ---------------------------------------------------------------------------------
    def _recv(self) -> None:
        assert self._sock is not None
        self._sock.settimeout(self._remaining())
        try:
            chunk = self._sock.recv(1 << 20)
        except TimeoutError:
            raise RedisTimeout(f"no answer within {self.timeout:g} s") from None
        except OSError as exc:
            raise RedisError(f"connection lost ({exc.strerror or exc})") from None
        if not chunk:
            raise RedisError("the server closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            if len(self._buf) > 1 << 16:
                raise RedisError("protocol error (header line too long)")
            self._recv()
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            self._recv()
        if self._buf[n:n + 2] != b"\r\n":  # the declared length is wrong: everything after it would be misread
            raise RedisError(f"protocol error (a {n} byte bulk reply is not followed by CRLF)")
        data, self._buf = self._buf[:n], self._buf[n + 2:]
        return data

    def _reply(self, depth: int = 0) -> object:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode(errors="replace")
        if kind == b"-":
            raise RedisError(f"server error: {rest.decode(errors='replace')[:200]}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            if n > self.max_reply:
                raise RedisError(f"reply of {n} bytes exceeds the {self.max_reply} byte limit")
            return self._exact(n)
        if kind == b"*":
            n = int(rest)
            if depth >= _MAX_DEPTH:  # the cache's commands get flat replies: deep nesting is garbage
                raise RedisError(f"protocol error (arrays nested more than {_MAX_DEPTH} deep)")
            if n > _MAX_ITEMS:  # reading only some of them would leave the rest to be taken for the next reply
                raise RedisError(f"protocol error (an array of {n} items; at most {_MAX_ITEMS} are accepted)")
            return None if n < 0 else [self._reply(depth + 1) for _ in range(n)]
        raise RedisError(f"protocol error (unexpected reply {line[:40]!r})")

    def _call(self, *parts: bytes | str | int) -> object:
        assert self._sock is not None
        self._sock.settimeout(self._remaining())
        try:
            self._sock.sendall(_encode(*parts))
        except TimeoutError:
            raise RedisTimeout(f"sending timed out after {self.timeout:g} s") from None
        except OSError as exc:
            raise RedisError(f"connection lost ({exc.strerror or exc})") from None
        try:
            return self._reply()
        except ValueError:
            raise RedisError("protocol error (bad length)") from None

    def call(self, *parts: bytes | str | int) -> object:
        """Send one command and return its reply, within the timeout (reconnecting once if needed)."""
        self._deadline = time.monotonic() + self.timeout
        try:
            if self._sock is None:
                self._connect()
            return self._call(*parts)
        except RedisError:
            self.close()  # a half-read reply must never be mistaken for the next one
            raise

    # -- commands ---------------------------------------------------------------------------------
    def ping(self) -> bool:
        return self.call("PING") == "PONG"

    def get(self, key: str) -> bytes | None:
        value = self.call("GET", key)
        if value is not None and not isinstance(value, bytes):
            raise RedisError(f"GET returned {type(value).__name__}")
        return value

    def delete(self, key: str) -> int:
        value = self.call("DEL", key)
        return int(value) if isinstance(value, int) else 0

    def set_nx(self, key: str, value: bytes, ttl_seconds: int | None = None) -> bool:
        """SET key value NX [EX ttl]: True when stored, False when the key already existed."""
        args: list[bytes | str | int] = ["SET", key, value, "NX"]
        if ttl_seconds:
            args += ["EX", ttl_seconds]
        return self.call(*args) == "OK"
