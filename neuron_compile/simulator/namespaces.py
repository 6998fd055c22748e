"""The ``nki``, ``nki.language`` (nl) and ``nki.isa`` (nisa) namespace objects.

Each is a module object with an explicit export table. A missing attribute raises
:class:`RemovedAPIError` naming the replacement for removed names, a ``DeprecationWarning`` for
deprecated aliases, ``NotImplementedError`` (also an ``ImportError``, for ``from ... import``) for public NKI
names the simulator does not implement (the list of public names is :mod:`neuron_compile.nki_api`), else
``AttributeError``.
"""

from __future__ import annotations

import logging
import types
import warnings
from typing import Any

from neuron_compile.errors import RemovedAPIError
from neuron_compile.nki_api import api

log = logging.getLogger(__name__)

API = api()


class UnimplementedNameError(NotImplementedError, ImportError):
    """A public NKI name the simulator does not implement. Also an ImportError, so ``from nki.collectives import
    ReplicaGroup`` inside ``try: ... except ImportError:`` falls back as under AWS's simulator (nki-library's
    attention_block_tkg does this)."""


class Namespace(types.ModuleType):
    """A module-like namespace whose misses explain themselves."""

    def __init__(self, name: str, exports: dict[str, Any], removed: dict[str, str] | None = None,
                 deprecated: dict[str, tuple[Any, str]] | None = None) -> None:
        super().__init__(name)
        self.__dict__.update(exports)
        object.__setattr__(self, "_exports", dict(exports))
        object.__setattr__(self, "_removed", dict(removed or {}))
        object.__setattr__(self, "_deprecated", dict(deprecated or {}))
        object.__setattr__(self, "_public", frozenset(API["modules"].get(name, ())))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        removed = self._removed.get(attr)
        if removed is not None:
            raise RemovedAPIError(f"{self.__name__}.{attr} is gone: {removed}")
        dep = self._deprecated.get(attr)
        if dep is not None:
            warnings.warn(f"{self.__name__}.{attr} is deprecated: {dep[1]}", DeprecationWarning, stacklevel=2)
            return dep[0]
        if attr in self._public:
            raise UnimplementedNameError(f"{self.__name__}.{attr} is not implemented by the neuron_compile simulator")
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self) -> list[str]:
        return sorted(self._exports)

    def implemented(self) -> list[str]:
        return sorted(n for n in self._exports if n in self._public or n in API["modules"].get(self.__name__, ()))
