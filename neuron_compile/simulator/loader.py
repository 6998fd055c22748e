"""``load_kernel_source``: execute NKI kernel source with its ``nki`` imports bound to the simulator.

The exec globals get their own ``__builtins__`` whose ``__import__`` resolves ``nki``,
``nki.language``, ``nki.isa`` (and ``from nki import ...`` forms) to the simulator namespaces;
everything else goes to the real import machinery. ``sys.modules`` is never touched, so a real
``nki`` installation stays importable and untouched. ``neuronxcc`` imports raise RemovedAPIError.
The source is registered with ``linecache`` so tracebacks show kernel lines. It is compiled with its own
``__future__`` imports only (not this module's ``annotations``), so its annotations are evaluated at ``def`` time as
when Python imports the kernel's module.
"""

from __future__ import annotations

import builtins
import linecache
import logging
from typing import Any

from neuron_compile.errors import RemovedAPIError

log = logging.getLogger(__name__)


def _resolver() -> Any:
    from neuron_compile.simulator import nki as sim_nki

    real_import = builtins.__import__
    subs = {"nki": sim_nki, "nki.language": sim_nki.language, "nki.isa": sim_nki.isa,
            "nki.collectives": sim_nki.collectives, "nki.typing": sim_nki.typing,
            "nki.isa.constants": sim_nki.isa.constants}

    def sim_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0:
            if name == "neuronxcc" or name.startswith("neuronxcc."):
                raise RemovedAPIError(f"'import {name}': the legacy neuronxcc.nki API is a compile error since NKI "
                                      "0.4.0; use 'import nki', 'import nki.language as nl', 'import nki.isa as nisa'")
            if name == "nki" or name.startswith("nki."):
                if name not in subs:
                    attr = name.split(".", 1)[1]
                    getattr(sim_nki, attr)  # raises NotImplementedError / AttributeError naming it
                    raise ImportError(f"No module named {name!r} in the neuron_compile simulator")
                if fromlist:
                    _check_fromlist(subs[name], fromlist)
                    return subs[name]
                return sim_nki
        return real_import(name, globals, locals, fromlist, level)

    return sim_import


def _check_fromlist(module: Any, fromlist: Any) -> None:
    """``from nki.language import par_dim``: an ImportError as under real NKI, whose message names the replacement
    (Python's own would only say 'cannot import name')."""
    for attr in fromlist:
        hint = getattr(module, "_removed", {}).get(attr)
        if hint is not None:
            raise ImportError(f"cannot import name {attr!r} from {module.__name__!r}: {module.__name__}.{attr} is "
                              f"gone: {hint}", name=module.__name__)


def load_kernel_source(source: str, filename: str = "<nki-kernel>") -> dict[str, object]:
    """Execute kernel source text against the simulator; returns the resulting globals."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec", dont_inherit=True)
    bdict = dict(builtins.__dict__)
    bdict["__import__"] = _resolver()
    # __name__ names an existing module so dataclasses / NKIObject subclasses can resolve it
    # without registering anything in sys.modules.
    env: dict[str, object] = {"__name__": __name__, "__file__": filename, "__builtins__": bdict}
    exec(code, env)
    log.debug("loaded kernel source %s (%d lines)", filename, source.count("\n") + 1)
    return env
