"""Per-key inter-process locks for the artifact cache.

Owns :class:`KeyLock`: an exclusive ``fcntl.flock`` on ``<root>/locks/<digest>.lock``. The kernel
drops a flock when its holder dies (even by SIGKILL), so a lock "held" by a dead process is
recovered with no staleness heuristics; on NFS, Linux maps flock onto byte-range locks, which
lock managers share across hosts. The holder writes ``{"pid", "host", "since"}`` into the file for
diagnostics only (waiting messages, ``neuron-compile cache``); that content is never trusted.

Lock files are opened with ``O_NOFOLLOW`` and checked after opening (a regular file with one link,
owned by this user) before anything is written into them, so a symlink or a hard link planted at
``locks/<key>.lock`` can't make the compiler truncate or overwrite a file outside the cache; such a
lock file is refused (:class:`UnsafeLockFile`) and the compile proceeds without the lock. (Why not
``filelock``: it also refuses symlinks since 3.20.1, but not hard links, and it neither records the
holder for the waiting message nor removes lock files, which this class does safely.)

Lock files are unlinked by their holder on release. A waiter that wins the lock on an inode that
was unlinked (or replaced) meanwhile notices it (``fstat`` vs ``stat``) and retries, so removing a
lock file never lets two processes hold the "same" lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path

log = logging.getLogger(__name__)

_POLL_MIN = 0.005
_POLL_MAX = 0.1


class UnsafeLockFile(OSError):
    """The lock file is a symlink, a hard link, not a regular file, or owned by someone else."""


def open_lock_file(path: Path) -> int:
    """Open (creating) a lock file without following links; refuse anything but our own plain file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLockFile(errno.ELOOP, "it is a symbolic link", str(path)) from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_nlink > 1:  # 0 is fine: its holder just unlinked it (the caller retries on a fresh file)
        problem = f"has {st.st_nlink} hard links"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}"
    if problem:
        os.close(fd)
        raise UnsafeLockFile(errno.EPERM, f"it {problem}", str(path))
    return fd


class LockTimeout(Exception):
    """The lock stayed held by another process for longer than the timeout."""

    def __init__(self, path: Path, waited: float, holder: dict[str, object] | None) -> None:
        self.path = path
        self.waited = waited
        self.holder = holder or {}
        super().__init__(f"lock {path} still held after {waited:.1f} s by {describe_holder(self.holder)}")


def describe_holder(holder: dict[str, object]) -> str:
    if not holder:
        return "an unknown process"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"


def read_holder(path: Path) -> dict[str, object] | None:
    """The diagnostic record a holder wrote into ``path`` (None if absent or unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            data = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_held(path: Path) -> bool:
    """Whether some live process holds the flock on ``path`` right now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class KeyLock:
    """Exclusive lock on one cache key; use ``acquire(timeout)`` then ``release()`` (or ``with``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float) -> None:
        """Block until the lock is ours; raise :class:`LockTimeout` after ``timeout`` seconds.

        Other ``OSError``s (missing folder, filesystem without locks) propagate to the caller, which
        decides how to degrade.
        """
        start = time.monotonic()
        delay = _POLL_MIN
        announced = False
        while True:
            fd = open_lock_file(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise LockTimeout(self.path, waited, read_holder(self.path)) from None
                if not announced and waited > 1.0:
                    log.info("neuron-compile cache: waiting for %s, which is compiling the same graph (%s)",
                             describe_holder(read_holder(self.path) or {}), self.path.name)
                    announced = True
                time.sleep(min(delay, max(0.0, timeout - waited)))
                delay = min(delay * 2, _POLL_MAX)
                continue
            if not self._same_file(fd):
                os.close(fd)  # the file we locked was unlinked/replaced by its previous holder: retry
                continue
            self._fd = fd
            record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, record.encode(), 0)
            except OSError:  # diagnostics only
                pass
            return

    def _same_file(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        fst = os.fstat(fd)
        return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: see the module docstring
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> KeyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
