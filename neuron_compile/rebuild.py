"""Verify an untrusted cache entry by recompiling it: code generation is deterministic.

Owns :func:`verify_by_recompiling`, used by ``neuron-compile cache import`` (unless ``--trust``)
and by the remote tier for entries that are not signed with the team secret. An entry stores the
graph it was compiled from (``graph.json``, see :mod:`neuron_compile.cache.graph_codec`); this
module decodes it, re-derives the key from the decoded graph under the entry's own target and
codegen knobs (so the stored graph must be the one the key names), compiles it again and compares
every artifact byte for byte. Kernel sources are executed Python, so an entry whose kernels differ
from what this compiler generates for its graph is refused: that is how an edited kernel with
recomputed manifest hashes is caught.

An entry made by a different build (other neuron-compile sources, torch or nki versions) can't be
recompiled to the same bytes here, and could never be hit here either: it is refused as
unverifiable. Whole-graph entries (a Dynamo graph with AOTAutograd's runtime wrappers) can only be
verified by re-tracing the model, which the first run does: they are refused too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

_ATEN_KINDS = ("forward", "backward", "inference")


class VerificationFailed(Exception):
    """The entry is not what this compiler produces for its stored graph (``reason``: one line)."""

    def __init__(self, reason: str, *, unverifiable: bool = False) -> None:
        self.reason = reason
        self.unverifiable = unverifiable
        super().__init__(reason)


def _environment_mismatch(parts: Mapping[str, Any]) -> str | None:
    import neuron_compile
    from neuron_compile.cache import key as key_mod

    mine = {"neuron_compile": {"version": neuron_compile.__version__, "source_sha256": key_mod.source_fingerprint()},
            "torch": key_mod._torch_version(), "nki": key_mod._dist_version("nki"),
            "neuronx_cc": key_mod._dist_version("neuronx-cc"), "schema": key_mod.SCHEMA_VERSION}
    for name, value in mine.items():
        if parts.get(name) != value:
            theirs = parts.get(name)
            if name == "neuron_compile" and isinstance(theirs, dict):
                theirs = f"{theirs.get('version')} (sources {str(theirs.get('source_sha256'))[:12]})"
                value = f"{value['version']} (sources {value['source_sha256'][:12]})"  # type: ignore[index]
            return f"made by a different build ({name} {theirs}, this host has {value}); it could never be used here"
    return None


def verify_by_recompiling(manifest: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    """Raise :class:`VerificationFailed` unless recompiling the stored graph reproduces ``files``."""
    from neuron_compile.cache.graph_codec import GRAPH_FILE, GraphCodecError, decode_graph

    parts = manifest.get("key_parts") or {}
    kind = parts.get("kind")
    if kind not in _ATEN_KINDS:
        raise VerificationFailed(f"a {kind} entry can only be verified by re-tracing the model (the first run "
                                 "recreates it)", unverifiable=True)
    problem = _environment_mismatch(parts)
    if problem:
        raise VerificationFailed(problem, unverifiable=True)
    if GRAPH_FILE not in files:
        raise VerificationFailed("it does not store the graph it was compiled from", unverifiable=True)
    try:
        gm, inputs = decode_graph(files[GRAPH_FILE])
    except GraphCodecError as exc:
        raise VerificationFailed(f"its stored graph is invalid ({exc})") from None
    rebuilt = _recompile(gm, inputs, parts, str(manifest.get("key")))
    if rebuilt is None:
        raise VerificationFailed("its stored graph does not hash to the entry's key")
    names = sorted(set(files) | set(rebuilt))
    for name in names:
        if files.get(name) != rebuilt.get(name):
            what = "is missing from the entry" if name not in files else \
                "is not produced by this compiler" if name not in rebuilt else "differs from what this compiler generates"
            raise VerificationFailed(f"file {name!r} {what} for the stored graph (tampered?)")


def _recompile(gm: Any, inputs: list[Any], parts: Mapping[str, Any], digest: str) -> dict[str, bytes] | None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from neuron_compile.cache.key import compute_key
    from neuron_compile.config import codegen_snapshot, config
    from neuron_compile.errors import NeuronCompileError
    from neuron_compile.pipeline import build_artifacts, stored_graph

    codegen = parts.get("codegen") or {}
    known = codegen_snapshot()
    if not isinstance(codegen, dict) or set(codegen) != set(known):
        raise VerificationFailed("its codegen settings are not this build's", unverifiable=True)
    try:
        with config.patch(**{"target": parts.get("target"), **codegen}):
            key = compute_key(gm, inputs, kind=str(parts["kind"]), extra=parts.get("extra") or {})
            if key.digest != digest:
                return None
            with unset_fake_temporarily():
                files, _summary, _plan = build_artifacts(gm, inputs)
            files.update(stored_graph(gm, inputs))
    except VerificationFailed:
        raise
    except (NeuronCompileError, TypeError, ValueError, KeyError) as exc:
        raise VerificationFailed(f"its stored graph does not compile here ({type(exc).__name__}: {exc})") from None
    return files
