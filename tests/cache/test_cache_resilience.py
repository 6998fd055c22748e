"""A bad cache never fails a compile and never changes a result: cases an adversarial probe found.

A cached kernel that does not compile, a manifest with a non-numeric field, an entry filed under another
key, a remote value that is a signed but truncated archive or a reply nested without end, a malformed
warm-frames setting, and a remote URL's password in messages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cache_helpers import run_py
from neuron_compile.cache import remote as remote_mod
from neuron_compile.cache import stats
from neuron_compile.cache import store as store_mod
from neuron_compile.cache.resp import RedisClient, RedisError, parse_redis_url
from neuron_compile.cache.store import CacheStore
from neuron_compile.cache.transfer import ArchiveError, entry_archive, import_archive

import neuron_compile.backend as B


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _fn(scale: float) -> object:
    """A graph of its own per test (the tests share one process: Dynamo's and the cache's per-process state)."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ y, dim=-1) * scale

    return fn


def _fb(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ y, dim=-1) - 1


ARGS = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),
        torch.randn(8, 8, generator=torch.Generator().manual_seed(1)))


def _compile(fn: object) -> torch.Tensor:
    torch._dynamo.reset()
    B.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend="neuron", dynamic=False)(*ARGS)
    torch.testing.assert_close(out, fn(*ARGS))
    return out


def _entries(root: Path, kind: str = "inference") -> list[Path]:
    return [root / "entries" / d for d in sorted(os.listdir(root / "entries"))
            if json.loads((root / "entries" / d / "manifest.json").read_text())["key_parts"]["kind"] == kind]


def _only_aten_entries(root: Path) -> None:
    """Drop the whole-graph entries (they would serve the graph before its ATen entry is looked up)."""
    for d in os.listdir(root / "entries"):
        if json.loads((root / "entries" / d / "manifest.json").read_text())["key_parts"]["kind"] != "inference":
            CacheStore(root).remove(d)
    store_mod.reset_process_state()


def _rewrite(entry: Path, name: str, blob: bytes) -> None:
    """Replace one file of an entry and recompute its manifest hash: the hashes alone can't tell."""
    (entry / name).write_bytes(blob)
    man = json.loads((entry / "manifest.json").read_text())
    man["files"][name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    (entry / "manifest.json").write_text(json.dumps(man))


def test_cached_kernel_that_does_not_compile_is_quarantined(cache_root: Path,
                                                            warnings_log: pytest.LogCaptureFixture) -> None:
    f = _fn(2.0)
    _compile(f)
    (entry,) = _entries(cache_root)
    kernel = next(n for n in json.loads((entry / "manifest.json").read_text())["files"] if n.startswith("kernels/"))
    _rewrite(entry, kernel, b"def broken(:\n")
    _only_aten_entries(cache_root)
    _compile(f)  # before: BackendCompilerFailed (SyntaxError) on every run
    assert any(f"entry {entry.name[:12]} is corrupt (its artifacts can't be loaded (SyntaxError" in w
               for w in _warnings(warnings_log))
    assert not entry.exists() or json.loads((entry / "manifest.json").read_text())["files"][kernel]["size"] > 20


def test_non_numeric_compile_seconds_is_still_a_hit(cache_root: Path) -> None:
    f = _fn(3.0)
    _compile(f)
    for entry in _entries(cache_root) + _entries(cache_root, "dynamo-inference"):
        man = json.loads((entry / "manifest.json").read_text())
        man["compile_seconds"] = "abc"
        (entry / "manifest.json").write_text(json.dumps(man))
    store_mod.reset_process_state()
    hits = stats.read_stats(cache_root)["hits"]
    _compile(f)  # before: ValueError from the hit's statistics
    assert stats.read_stats(cache_root)["hits"] == hits + 1


def test_entry_filed_under_another_key_is_refused(cache_root: Path, warnings_log: pytest.LogCaptureFixture) -> None:
    """Two entries' folders swapped, each manifest naming its new folder: the key parts give it away."""
    fa = _fn(4.0)
    _compile(fa)
    _compile(_fb)
    a, b = _entries(cache_root)
    for entry, other in ((a, b), (b, a)):
        man = json.loads((entry / "manifest.json").read_text())
        man["key"] = other.name
        (entry / "manifest.json").write_text(json.dumps(man))
    os.rename(a, cache_root / "swap")
    os.rename(b, a)
    os.rename(cache_root / "swap", b)
    _only_aten_entries(cache_root)
    _compile(fa)  # asserts the result: before, _fb's kernels ran for fa
    _compile(_fb)
    assert sum("key parts hash to" in w for w in _warnings(warnings_log)) == 2


def test_signed_but_truncated_remote_archive_is_refused(cache_root: Path) -> None:
    """The remote value's archive cut short (a correct frame): ArchiveError, which the remote tier reports as a
    refused entry, never an EOFError out of the compile."""
    _compile(_fn(5.0))
    (entry,) = _entries(cache_root)
    payload = entry_archive(CacheStore(cache_root), entry.name)
    other = CacheStore(cache_root.parent / "other")
    with pytest.raises(ArchiveError, match="cannot read the archive: EOFError"):
        import_archive(other, payload[: len(payload) // 2])


class _Server:
    """A one-shot TCP server on a free loopback port that answers every request with ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture
def deep_server() -> Iterator[_Server]:
    server = _Server(b"*1\r\n" * 200_000)
    try:
        yield server
    finally:
        server.close()


def test_reply_nested_without_end_is_a_protocol_error(deep_server: _Server) -> None:
    client = RedisClient(parse_redis_url(f"redis://127.0.0.1:{deep_server.port}/0"), timeout=5.0)
    with pytest.raises(RedisError, match="arrays nested more than 8 deep"):
        client.get("k")
    client.close()


@pytest.mark.parametrize(("reply", "message"), [
    (b"$3\r\nabcdef\r\n", "a 3 byte bulk reply is not followed by CRLF"),  # a length too short
    (b"$3\r\nab\r\nxx", "a 3 byte bulk reply is not followed by CRLF"),  # a length too long
    (b"*70000\r\n" + b":1\r\n" * 70000, "an array of 70000 items; at most 65536 are accepted"),
])
def test_misframed_reply_is_a_protocol_error(reply: bytes, message: str) -> None:
    """A reply whose declared length disagrees with its framing is refused whole (and the connection dropped):
    reading on would take the rest of it for the next command's answer."""
    server = _Server(reply)
    try:
        client = RedisClient(parse_redis_url(f"redis://127.0.0.1:{server.port}/0"), timeout=5.0)
        with pytest.raises(RedisError, match=re.escape(f"protocol error ({message})")):
            client.get("k")
        assert client._sock is None
    finally:
        server.close()


def test_remote_that_raises_anything_turns_the_tier_off(cache_root: Path, deep_server: _Server,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         warnings_log: pytest.LogCaptureFixture) -> None:
    tier = remote_mod.make_remote(f"redis://127.0.0.1:{deep_server.port}/0", CacheStore(cache_root))
    assert tier is not None
    monkeypatch.setattr(tier._client, "get", lambda *a: (_ for _ in ()).throw(RecursionError("deep")))
    from cache_helpers import synthetic_key

    assert tier.fetch(synthetic_key("x")) is None
    assert tier.disabled is not None and "RecursionError" in tier.disabled
    assert any("unavailable" in w for w in _warnings(warnings_log))


def test_malformed_warm_frames_setting_is_one_warning_not_an_import_error(tmp_path: Path) -> None:
    proc = run_py("""
        import torch, neuron_compile
        print(torch.compile(lambda x: x * 2, backend="neuron")(torch.ones(3)).tolist())
    """, env={"NEURON_COMPILE_WARM_FRAMES": "perhaps", "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0]"
    assert "NEURON_COMPILE_WARM_FRAMES=perhaps: expected a boolean" in proc.stderr
    assert "warm frames are off in this process" in proc.stderr and "Traceback" not in proc.stderr


def test_remote_url_errors_never_show_the_password() -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_url("redis://admin:TopSecretPw@127.0.0.1:99999/0")
    assert "TopSecretPw" not in str(info.value)
    assert "'redis://admin:***@127.0.0.1:99999/0': the port is not a number" in str(info.value)
