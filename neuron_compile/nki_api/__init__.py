"""The public NKI 0.6 API as data: names, signatures, kinds, engines, deprecations and removals.

Source of truth: the listing ``nki_0_6.api`` in this package (our own format); ``tools/gen_nki_api.py``
generates ``nki_0_6.json`` from it, which is what this module loads (once, from the package itself,
never from a path outside it). Users: the simulator's namespaces (which names are public), the static
checker :func:`neuron_compile.nki_api.checker.check_source_against_api`, and the tests.
"""

from __future__ import annotations

import functools
import json
import logging
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

NKI_VERSION = "0.6.0"
JSON_NAME = "nki_0_6.json"
LISTING_NAME = "nki_0_6.api"


@functools.lru_cache(maxsize=1)
def api() -> dict[str, Any]:
    """The generated API document (``entries``, ``modules``, ``members``, ``removed``)."""
    return json.loads(resources.files(__name__).joinpath(JSON_NAME).read_text())


def public_names(module: str) -> list[str]:
    """Top-level public names of ``module`` (e.g. ``"nki.isa"``), sorted."""
    return list(api()["modules"].get(module, ()))


def members(owner: str) -> list[str]:
    """Members of a public class or enum (``"nki.language.NkiTensor"``), sorted."""
    return list(api()["members"].get(owner, ()))


def entry(module: str, qualname: str) -> dict[str, Any] | None:
    """The listing entry of ``module.qualname``, or None."""
    return _by_name().get((module, qualname))


@functools.lru_cache(maxsize=1)
def _by_name() -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["module"], e["qualname"]): e for e in api()["entries"]}


def isa_instructions() -> list[str]:
    """The public ``nki.isa`` names (instructions, enums, classes: what ``nisa.X`` may name)."""
    return public_names("nki.isa")


def dst_first_isa_ops() -> frozenset[str]:
    """``nki.isa`` functions whose first parameter is ``dst``."""
    return frozenset(e["qualname"] for e in api()["entries"]
                     if e["module"] == "nki.isa" and e["kind"] == "function" and e["params"]
                     and e["params"][0][0] == "dst")


__all__ = ["NKI_VERSION", "api", "dst_first_isa_ops", "entry", "isa_instructions", "members", "public_names"]
