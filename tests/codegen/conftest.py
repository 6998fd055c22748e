"""Fixtures for the code generator tests: the ``--update-golden`` flag and the compiled corpus.

The corpus (``corpus.py``) is compiled once per session, lazily per entry, and shared by the
conformance and golden tests. Golden files under ``golden/`` are data, never collected as tests.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (shared helpers)

from corpus import CorpusResult, compile_entry  # noqa: E402

log = logging.getLogger(__name__)

collect_ignore_glob = ["golden/*"]

UPDATE_ENV = "NEURON_COMPILE_UPDATE_GOLDEN"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help=f"rewrite tests/codegen/golden/*.nki.py from the current render (or set {UPDATE_ENV}=1)")


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False)) or os.environ.get(UPDATE_ENV, "") not in ("", "0")


class CorpusCache:
    def __init__(self, lnc: int = 0) -> None:
        self.results: dict[str, CorpusResult] = {}
        self.lnc = lnc  # config.lnc the corpus is compiled with (0: the target's default, 2 on trn2)

    def get(self, name: str) -> CorpusResult:
        from corpus import BY_NAME

        from neuron_compile.config import config

        if name not in self.results:
            with warnings.catch_warnings(), config.patch(lnc=self.lnc):
                warnings.filterwarnings("ignore", message=".*doesn't take boxed arguments.*")
                self.results[name] = compile_entry(BY_NAME[name])
        return self.results[name]


@pytest.fixture(scope="session")
def corpus_results() -> CorpusCache:
    return CorpusCache()


@pytest.fixture(scope="session")
def corpus_single_core() -> CorpusCache:
    """The corpus on one core (LNC=1): tests that pin a single-core loop structure."""
    return CorpusCache(lnc=1)
