"""The render of every corpus kernel is pinned by its SHA-256 (``render_hashes.json``).

The five golden files (``test_golden.py``) show a handful of kernels in full; this test covers every
kernel of every corpus entry, so a refactor of the code generator (a renderer moved into a template, an
index expression simplified by sympy) proves it renders byte-identical NKI for the whole corpus. When
a difference is deliberate, regenerate with ``pytest tests/codegen --update-golden`` and say why in the
commit; ``python tools/render_snapshot.py --out DIR`` writes the sources themselves for a ``diff -r``
before and after.

A few entries reach the backend as another graph under another torch release (torch 2.13 copies a strided
slice before viewing it where 2.14 views it in place): ``render_hashes.json`` pins those under
``"torch-<major.minor>"`` for every release but the first one the package supports, which the main table pins.
``--update-golden`` run under a later release records only what differs there; a deliberate change to such an
entry is regenerated under both releases (CI's torch 2.14 leg runs this test too).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CORPUS

log = logging.getLogger(__name__)

HASHES = Path(__file__).resolve().parent / "render_hashes.json"
NAMES = [e.name for e in CORPUS]
BASE_TORCH = "2.13"  # the oldest torch the package supports (pyproject.toml): its renders are the main table
TORCH = "torch-" + ".".join(torch.__version__.split(".")[:2])


def digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


@pytest.fixture(scope="module")
def pinned(update_golden: bool) -> dict[str, dict[str, str]]:
    table = json.loads(HASHES.read_text()) if HASHES.is_file() else {}
    yield table
    if update_golden:
        releases = {k: v for k, v in table.items() if k.startswith("torch-") and v}
        table = {name: table[name] for name in NAMES if name in table}
        HASHES.write_text(json.dumps({**table, **releases}, indent=1, sort_keys=True) + "\n")
        log.warning("regenerated %s", HASHES)


def _expected(pinned: dict[str, dict[str, Any]], name: str) -> dict[str, str] | None:
    return pinned.get(TORCH, {}).get(name, pinned.get(name))


@pytest.mark.parametrize("name", NAMES)
def test_render_is_byte_identical(name: str, corpus_results, pinned: dict[str, dict[str, str]],
                                  update_golden: bool) -> None:
    current = {kernel: digest(src) for kernel, src in corpus_results.get(name).sources.items()}
    if update_golden:
        if TORCH == f"torch-{BASE_TORCH}" or name not in pinned:
            pinned[name] = current
        elif current != pinned[name]:
            pinned.setdefault(TORCH, {})[name] = current
        else:
            pinned.get(TORCH, {}).pop(name, None)
        return
    expected = _expected(pinned, name)
    assert expected is not None, f"{name}: no pinned render in {HASHES.name}; run pytest tests/codegen --update-golden"
    changed = sorted(k for k in current.keys() & expected.keys() if current[k] != expected[k])
    added, removed = sorted(current.keys() - expected.keys()), sorted(expected.keys() - current.keys())
    assert not (changed or added or removed), (
        f"{name}: the rendered NKI differs from {HASHES.name}: changed {changed}, new {added}, gone {removed}. "
        "Compare the sources with tools/render_snapshot.py --out DIR on both revisions (diff -r); if the change "
        "is deliberate, run pytest tests/codegen --update-golden and say why in the commit")


def test_every_pinned_entry_is_in_the_corpus() -> None:
    table = json.loads(HASHES.read_text())
    releases = [k for k in table if k.startswith("torch-")]
    stale = sorted((table.keys() - set(releases) - set(NAMES)) | {n for r in releases for n in table[r]} - set(NAMES))
    assert not stale, f"{HASHES.name} pins entries that are no longer in corpus.py: {stale}"
