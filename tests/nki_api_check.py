"""Kept for tests that import the checker by this name: it lives in :mod:`neuron_compile.nki_api.checker`."""

from __future__ import annotations

from neuron_compile.nki_api.checker import check_source_against_api

__all__ = ["check_source_against_api"]
