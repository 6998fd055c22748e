"""Content-addressed cache of compiled artifacts (installed as ``neuron_compile.cache``).

The backend calls :func:`compute_key` then :func:`get_or_compile`; see ``docs/cache.md``.
``key`` derives keys, ``store`` reads and publishes entries, ``lock`` serializes compiles of one
key across processes, ``manifest`` defines and checks entries, ``stats`` counts, ``cli`` is
``neuron-compile cache``, ``remote`` the shared Redis tier (``resp`` its client), ``graph_codec``
the stored graph an entry is verified from, ``transfer`` archives.
"""

from __future__ import annotations

from neuron_compile.cache import remote  # noqa: E402,F401  (registers the remote tier's factory)
from neuron_compile.cache.key import SCHEMA_VERSION, CacheKey, canonical_graph, compute_key, input_signature
from neuron_compile.cache.store import CacheEntry, CacheStore, get_or_compile

__all__ = [
    "SCHEMA_VERSION",
    "CacheEntry",
    "CacheKey",
    "CacheStore",
    "canonical_graph",
    "compute_key",
    "get_or_compile",
    "input_signature",
]
