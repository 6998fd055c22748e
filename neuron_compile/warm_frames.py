"""Warm frames: a warm fresh process skips Dynamo's capture too (on by default; ``NEURON_COMPILE_WARM_FRAMES=0`` turns it off).

:mod:`neuron_compile.warm_start` rebuilds a whole Dynamo graph's callable from the cache without
AOTAutograd, but Dynamo still captures the model's Python first: for a Hugging Face GPT-2 that is
~5 s of a 5.5 s warm first call. torch 2.13 and 2.14 have a mechanism that skips it, "caching precompile"
(``torch._dynamo.config.caching_precompile``, ``torch._dynamo.package``): each ``torch.compile``
gets a ``CompilePackage`` that records, per compiled frame, Dynamo's transformed bytecode, its
guards (pickled as ``GuardsState``), the sources it inlined (with checksums) and one
``BackendCacheArtifact`` per compiled graph (its ``__compiled_fn_*`` name); a later process
installs all of that on the function's code object, so the first call only evaluates guards.

What a backend must provide: an artifact recorded in ``PrecompileContext`` under the graph's
backend id (``gm._backend_id``, set by Dynamo only when a package exists) whose
``after_deserialization()`` returns the compiled callable. Ours (:class:`NeuronFrameArtifact`)
holds the digest of the graph's warm-start entry, so the callable is rebuilt by
``warm_start.load_entry`` with all its checks (kernels verified against their manifests).

Where the packages live: torch's ``DynamoCache`` (a module global in ``torch._dynamo.package``,
imported by name at each use) is replaced by :class:`NeuronDynamoCache`, which keeps neuron
packages as ``dynamo-frame`` entries of our cache (manifest, key = function identity + its source
file's sha256 + torch/Python/neuron-compile versions + codegen knobs; a corrupt entry is
quarantined with one WARNING and the frame traced as usual) and hands anything else to torch's.

Guards: with ``caching_precompile`` on, torch drops every guard it can't serialize (object identity:
``ID_MATCH``, ``CLASS_MATCH``, ``CLOSURE_MATCH``, ``DICT_VERSION``... in ``CheckFunctionManager.__init__``,
torch/_dynamo/guards.py), in the compiling process and in every process that loads the package, so a
rebound global function or a monkeypatched torch function went unseen. :mod:`neuron_compile.warm_guards`
undoes that in our scope: the compiling process keeps every guard, each identity guard is packaged as a
fingerprint (module/class/builtin by name, function by code hash, defaults and closure, a config object
deep-copied in ``forward`` by class name and state) checked in the loading process, and a frame with a
guard no fingerprint can stand for is not packaged (traced in every process). Resume frames (after a
graph break) are packaged by torch itself (``CompilePackage.add_resume_function``) and loaded with the
frame they resume. That is what makes warm frames safe to have on by default. They apply only to
``torch.compile`` calls whose backend is ``neuron`` while the cache is on; other backends in the same
process are untouched.
"""

from __future__ import annotations

import contextlib
import dis
import hashlib
import importlib
import inspect
import json
import logging
import pickle
import platform
import re
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

FRAME_FILE = "dynamo_frame.pkl"
BACKENDS_FILE = "backends.json"
KIND = "dynamo-frame"

_scope = threading.local()
_ORIGINAL: dict[str, Any] = {}
# torch releases whose Dynamo internals the repairs here and in warm_guards were written against and tested with;
# with any other torch a warm start takes the AOT path (always right, it just traces the frame again)
VERIFIED_TORCH = ("2.13.", "2.14.")


def supported(version: str | None = None) -> bool:
    """Whether warm frames may be installed with torch ``version`` (default: the installed one)."""
    return (torch.__version__ if version is None else version).startswith(VERIFIED_TORCH)


_loaded_graphs: list[str] = []  # backend ids installed from the cache in this process (tests, benchmark)


def enabled() -> bool:
    """The knob; a malformed value is off (the backend warned once at import)."""
    from neuron_compile.config import config
    from neuron_compile.errors import ConfigError

    try:
        return bool(config.warm_frames)
    except ConfigError:
        return False


def loaded_graphs() -> list[str]:
    return list(_loaded_graphs)


@contextlib.contextmanager
def _precompile_scope() -> Iterator[None]:
    """torch's caching precompile switched on, for one neuron ``torch.compile`` (its frames, its package).

    Module hooks are guarded too (``skip_nnmodule_hook_guards`` off; by default Dynamo assumes the hooks it saw
    never change): a frame compiled without a forward hook must not be loaded by a process that registered one
    before compiling, where a fresh trace would run it."""
    depth = getattr(_scope, "depth", 0)
    _scope.depth = depth + 1
    try:
        with torch._dynamo.config.patch(caching_precompile=True, skip_nnmodule_hook_guards=False):
            yield
    finally:
        _scope.depth = depth


def _in_scope() -> bool:
    return getattr(_scope, "depth", 0) > 0


# --------------------------------------------------------------------------------------------
# The backend's artifact


def _artifact_class() -> type:
    from torch._dynamo.precompile_context import BackendCacheArtifact

    class NeuronFrameArtifact(BackendCacheArtifact[Callable[..., Any]]):
        """A compiled graph of a Dynamo package: ``content`` is its warm-start entry digest (str), or the
        callable already rebuilt from it (when a package is being loaded)."""

        def after_deserialization(self) -> Callable[..., Any]:
            if callable(self.content):
                return self.content
            raise RuntimeError(f"neuron-compile: graph {self.key} was not loaded from the cache")

    return NeuronFrameArtifact


_ARTIFACT: list[type] = []


def artifact(backend_id: str, content: Any) -> Any:
    if not _ARTIFACT:
        _ARTIFACT.append(_artifact_class())
    return _ARTIFACT[0](key=backend_id, content=content)


def record_graph(gm: torch.fx.GraphModule, warm_digest: str) -> None:
    """Tell the package being built which warm-start entry serves this Dynamo graph."""
    backend_id = getattr(gm, "_backend_id", None)
    if not _in_scope() or not isinstance(backend_id, str):
        return
    from torch._dynamo.precompile_context import PrecompileContext

    PrecompileContext.record_artifact(artifact(backend_id, warm_digest))


# --------------------------------------------------------------------------------------------
# Keys and storage


def frame_key(fn: Any) -> Any:
    """The key of ``fn``'s package: which function (qualname, first line, file and its sha256, its code), versions,
    knobs."""
    import neuron_compile
    from neuron_compile import warm_guards
    from neuron_compile.cache.key import (
        SCHEMA_VERSION,
        CacheKey,
        _torch_version,
        codegen_snapshot,
        digest_of,
        source_fingerprint,
    )
    from neuron_compile.config import config

    if not _has_python_code(fn):
        return None  # a builtin (torch.compile(torch.mm)) or another callable without Python code: no package
    inner = torch._dynamo.eval_frame.innermost_fn(fn)
    code = inner.__code__
    try:
        source_sha = hashlib.sha256(Path(code.co_filename).read_bytes()).hexdigest()
    except OSError:
        return None  # no file (a REPL, exec'd code): nothing to tie a package to
    parts: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "kind": KIND,
        "neuron_compile": {"version": neuron_compile.__version__, "source_sha256": source_fingerprint()},
        "torch": _torch_version(),
        "python": platform.python_version(),
        "target": config.target,
        "codegen": json.loads(json.dumps(codegen_snapshot(), sort_keys=True, default=str)),
        # the code itself too: lambdas written on one line share qualname, line and file
        "function": {"module": inner.__module__, "qualname": inner.__qualname__, "line": code.co_firstlineno,
                     "file": Path(code.co_filename).name, "file_sha256": source_sha,
                     "code_sha256": warm_guards.code_hash(code)},
    }
    return CacheKey(digest=digest_of(parts), parts=parts)


def _without_module_texts(entry: Any) -> Any:
    """The entry without the full text of every module it inlined (``InlinedSource.content``: ~1.3 MB
    of transformers for GPT-2, never read back; the line ranges and checksums are what loading checks)."""
    import dataclasses

    info = entry.source_info
    sources = {dataclasses.replace(src, content="") for src in info.inlined_sources}
    return dataclasses.replace(entry, source_info=dataclasses.replace(info, inlined_sources=sources))


def _with_real_module(fn: Any, entry: Any) -> Any:
    """The entry with its first code's module set to the one whose globals that code runs with.

    ``CompilePackage`` records ``fn.__module__``, which ``functools.wraps`` copies from the decorated
    function: a decorated ``forward`` (transformers' ``GPT2LMHeadModel.forward``) runs with the
    decorator module's globals, so the guards would read (and ``install`` would put the compiled graph
    into) the wrong module's globals and never match."""
    import dataclasses

    inner = torch._dynamo.eval_frame.innermost_fn(fn)
    real = getattr(inner, "__globals__", {}).get("__name__")
    if not entry.codes or not isinstance(real, str) or entry.codes[0].python_module == real:
        return entry
    return dataclasses.replace(entry, codes=[dataclasses.replace(entry.codes[0], python_module=real),
                                             *entry.codes[1:]])


_DYNAMO_MODULE_GLOBAL = re.compile(r"^___module_\w+_\d+_c\d+$")
# Python's own dunders, and the builtins dict ``install`` restores from the guards' state.
_KEPT_DUNDER = re.compile(r"^(__[a-z]+__|__builtins_dict___\d+)$")


def _global_names(code: types.CodeType) -> set[str]:
    """Names ``code`` (and code nested in it) loads as globals."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return {n for n in names if isinstance(n, str)}


def _with_module_globals(entry: Any) -> Any:
    """The entry with every module Dynamo's bytecode loads as a global named in ``import_sources``.

    Dynamo's codegen loads a module it needs (``collections`` to rebuild an ``OrderedDict`` output)
    through a global ``___module_<name>_<id>_c<n>`` it installs in the frame's globals
    (``PyCodegen.create_load_python_module`` in torch/_dynamo/codegen.py) without telling the
    package, so ``CompilePackage.install`` never restores it and the loaded bytecode raises NameError.
    Any other Dynamo-made global the package does not restore makes the package unusable: ValueError."""
    import dataclasses
    import sys

    from torch._dynamo.package import SerializedCode

    restored = {str(name) for code in entry.codes for name in code.function_names}
    restored |= {str(b) for code in entry.codes for b in code.backend_ids}
    codes = []
    for code in entry.codes:
        module_globals = sys.modules[code.python_module].__dict__
        sources = dict(code.import_sources)
        for guarded in code.guarded_codes:
            for name in _global_names(SerializedCode.to_code_object(guarded.dynamo_code)):
                if name in restored or name in sources or not name.startswith("__") or _KEPT_DUNDER.match(name):
                    continue
                value = module_globals.get(name)
                if _DYNAMO_MODULE_GLOBAL.match(name) and isinstance(value, types.ModuleType):
                    sources[name] = value.__name__
                else:  # another global Dynamo installed (warnings wrapper, rand values, weakrefs, streams...)
                    raise ValueError(f"its bytecode loads global {name!r}, which the package does not restore")
        codes.append(dataclasses.replace(code, import_sources=sources))
    return dataclasses.replace(entry, codes=codes)


def _reserve_installed_names(dynamo: Any, builtins_names: set[str]) -> None:
    """Move Dynamo's name counter past every numbered global the package installs.

    ``CompilePackage.install`` puts the package's globals (``__builtins_dict___0``, resume functions
    ``__resume_at_*_N``) into module globals under the names the compiling process drew from
    ``unique_id`` (torch/_dynamo/bytecode_transformation.py); this process's counter starts at 0
    again, so the next frame Dynamo compiles in that module (a guard failure) would draw the same
    name and fail with "Name '__builtins_dict___0' already exists in scope"."""
    import itertools

    from torch._dynamo import bytecode_transformation as bt
    from torch._dynamo.package import SerializedCode

    names = set(builtins_names) | {str(n) for code in dynamo.codes for n in code.function_names}
    for code in dynamo.codes:
        for guarded in code.guarded_codes:
            names |= _global_names(SerializedCode.to_code_object(guarded.dynamo_code))
    numbers = [int(m.group(1)) for n in names if (m := re.match(r"^__\w*?_(\d+)$", n))]
    if numbers:
        current = next(bt._unique_id_counter)
        bt._unique_id_counter = itertools.count(max(current, max(numbers) + 1))


def _sources_unchanged(dynamo: Any) -> str | None:
    """None when every source the package inlined is unchanged, else which one changed."""
    from torch._dynamo.package import _hash_sourcelines

    for src in dynamo.source_info.inlined_sources:
        try:
            module = importlib.import_module(src.module)
            if _hash_sourcelines(module, src.firstlineno, src.lastlineno) != src.checksum:
                return f"{src.module} lines {src.firstlineno}-{src.lastlineno}"
        except Exception as exc:  # a module that no longer imports is a change too
            return f"{src.module} ({type(exc).__name__})"
    return None


def _rebuild_guards(fn: Any, dynamo: Any) -> set[str]:
    """Build every guard manager of a package the way ``CompilePackage.install`` will (raises if torch can't).

    torch pickles values it can't name as ``_Missing`` placeholders (e.g. a decorated method's inner
    function: "fqn mismatch" in ``GuardsStatePickler.reducer_override``), and a guard on such a value
    fails only when rebuilt, with an AttributeError ``install`` does not catch."""
    import sys

    from torch._dynamo.output_graph import get_builtins_dict
    from torch._dynamo.package import SerializedCode, _lookup_code, load_guard_manager, load_guards_state

    inner = torch._dynamo.eval_frame.innermost_fn(fn)
    guards_log = logging.getLogger("torch._guards")  # logs each failing guard at ERROR before raising
    was_disabled, guards_log.disabled = guards_log.disabled, True
    try:
        return _rebuild_each(inner, dynamo, get_builtins_dict, SerializedCode, _lookup_code, load_guard_manager,
                             load_guards_state, sys.modules)
    finally:
        guards_log.disabled = was_disabled


def _rebuild_each(inner: Any, dynamo: Any, get_builtins_dict: Any, SerializedCode: Any, _lookup_code: Any,  # noqa: N803
                  load_guard_manager: Any, load_guards_state: Any, modules: Any) -> set[str]:
    builtins_names: set[str] = set()
    for i, code_entry in enumerate(dynamo.codes):
        if code_entry.bypassed:
            continue
        target: types.CodeType = inner.__code__ if i == 0 else SerializedCode.to_code_object(code_entry.python_code)
        if code_entry.code_source:
            target = _lookup_code(code_entry)
        for guarded in code_entry.guarded_codes:
            state = load_guards_state(guarded.guards_state)
            scope = dict(modules[code_entry.python_module].__dict__)
            for alias, module_name in code_entry.import_sources.items():  # what install() puts there first
                scope.setdefault(alias, importlib.import_module(module_name))
            name = state.output_graph.name_of_builtins_dict_key_in_fglobals
            if name and name not in scope:
                scope[name] = get_builtins_dict(scope)
            if name:
                builtins_names.add(str(name))
            load_guard_manager(state, target, scope)
    return builtins_names


class NeuronDynamoCache:
    """Stands in for ``torch._dynamo.package.DynamoCache``: neuron packages go to our cache, others to torch's."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    # -- called by Dynamo after each frame it converted (torch/_dynamo/convert_frame.py) --------
    def record_package(self, package: Any) -> None:
        if not _in_scope():
            return self.original.record_package(package)
        try:
            self._store(package)
        except Exception as exc:  # never fail a compile because of the cache
            log.warning("neuron-compile cache: Dynamo package of %s not stored (%s: %s)",
                        getattr(package._innermost_fn, "__qualname__", "?"), type(exc).__name__, exc)
        return None

    def _store(self, package: Any) -> None:
        from torch._dynamo.precompile_context import PrecompileContext

        from neuron_compile.cache.store import CacheStore

        store = CacheStore.default()
        key = frame_key(package._innermost_fn)
        if store is None or key is None:
            return
        entry = _with_real_module(package._innermost_fn, package.cache_entry())
        entry = _without_module_texts(entry)
        try:
            entry = _with_module_globals(entry)
        except ValueError as exc:
            log.info("neuron: Dynamo package of %s not stored: %s", entry.fn_name, exc)
            return
        if getattr(package, "_neuron_unstorable", False) or any(c.bypassed for c in entry.codes):
            # a frame torch (or warm_guards) could not package
            log.info("neuron: Dynamo package of %s not stored: a frame of it can't be packaged", entry.fn_name)
            return
        codes = [c for c in entry.codes if c.guarded_codes]
        if not codes:
            log.debug("warm frames: nothing of %s can be packaged", key.short)
            return
        backends: dict[str, str] = {}
        for code in entry.codes:
            for backend_id in code.backend_ids:
                art = PrecompileContext.serialize_artifact_by_key(backend_id)
                digest = getattr(art, "content", None)
                if art is None or type(art).__name__ != "NeuronFrameArtifact" or not isinstance(digest, str):
                    log.info("neuron: Dynamo package of %s not stored: graph %s has no warm-start entry",
                             entry.fn_name, backend_id)
                    return
                backends[backend_id] = digest
        with torch.utils._python_dispatch._disable_current_modes():
            blob = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _rebuild_guards(package._innermost_fn, pickle.loads(blob))
        except Exception as exc:
            log.info("neuron: Dynamo package of %s not stored: torch can't rebuild its guards in another process "
                     "(%s: %s)", entry.fn_name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return
        files = {FRAME_FILE: blob, BACKENDS_FILE: json.dumps(backends, sort_keys=True).encode()}
        old = store.lookup_local(key)
        if old is not None:
            if old.read(FRAME_FILE) == blob:
                return
            store.remove(key.digest)  # the package grew (a recompile): replace it
        summary = {"kernels": [], "whole_graph": True, "children": sorted(set(backends.values()))}
        if store.publish(key, files, summary, 0.0) is not None:
            log.info("neuron: Dynamo package of %s stored (%d frames, %d graphs)", entry.fn_name, len(codes),
                     len(backends))

    # -- called when a neuron torch.compile'd function is first wrapped (torch/_dynamo/eval_frame.py) --
    def load(self, fn: Any) -> Any:
        if not _in_scope():
            return self.original.load(fn)
        from neuron_compile.cache.store import CacheStore

        store = CacheStore.default()
        key = frame_key(fn)
        entry = store.lookup(key) if store is not None and key is not None else None
        if entry is None:
            return None
        from torch._dynamo.package import PrecompileCacheEntry
        from torch._dynamo.precompile_context import PrecompileContext

        from neuron_compile import warm_start

        try:
            backends_map = json.loads(entry.read(BACKENDS_FILE))
            with torch.utils._python_dispatch._disable_current_modes():
                dynamo = pickle.loads(entry.read(FRAME_FILE))
            changed = _sources_unchanged(dynamo)
            if changed is not None:
                log.info("neuron: Dynamo package of %s is stale (%s changed): tracing", dynamo.fn_name, changed)
                return None
            builtins_names = _rebuild_guards(fn, dynamo)
            backends: dict[str, Any] = {}
            for backend_id, digest in backends_map.items():
                fn_ = warm_start.load_entry(str(digest))
                if fn_ is None:
                    log.info("neuron: Dynamo package of %s needs graph %s, which is not cached: tracing",
                             dynamo.fn_name, str(digest)[:12])
                    return None
                backends[backend_id] = artifact(backend_id, fn_)
        except Exception as exc:  # never fail a compile because of the cache
            store.quarantine(key.digest, f"its Dynamo package can't be loaded ({type(exc).__name__}: {exc})")
            return None
        _reserve_installed_names(dynamo, builtins_names)
        for backend_id, digest in backends_map.items():  # a recompile here re-stores the package with them
            PrecompileContext.record_artifact(artifact(backend_id, str(digest)))
        _loaded_graphs.extend(backends)
        log.info("neuron: %s from the cache without tracing (%d graphs)", dynamo.fn_name, len(backends))
        return PrecompileCacheEntry(dynamo=dynamo, backends=backends)


# --------------------------------------------------------------------------------------------
# Guards of decorated functions


def _wrapped_ref(obj: Any) -> tuple[str, str, int] | None:
    """(module, qualname, depth) when ``obj`` is the function ``depth`` ``__wrapped__`` steps below its
    qualified name (a decorated method: ``GPT2LMHeadModel.forward`` is transformers' wrapper), else None."""
    import sys

    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not isinstance(module, str) or "<locals>" in qualname or module not in sys.modules:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    for depth in range(8):
        if found is None:
            return None
        if found is obj:
            return (module, qualname, depth) if depth else None  # depth 0: torch pickles it by name itself
        found = getattr(found, "__wrapped__", None)
    return None


def _wrapped_function(module: str, qualname: str, depth: int) -> Any:
    """Unpickles what :func:`_wrapped_ref` describes (in the process that loads a package)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    for _ in range(depth):
        found = found.__wrapped__
    return found


def _patch_guard_pickler() -> None:
    """torch pickles a function its qualified name does not reach as a ``_Missing`` placeholder ("fqn
    mismatch" in ``GuardsStatePickler.reducer_override``, torch/_dynamo/guards.py), so no package of a
    decorated ``forward`` (every Hugging Face model) can be loaded: its guards read the inner function's
    closure. In our scope, such a function reached through ``__wrapped__`` is pickled as that path."""
    import inspect

    from torch._dynamo.guards import GuardsStatePickler

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        if _in_scope() and inspect.isfunction(obj):
            ref = _wrapped_ref(obj)
            if ref is not None:
                return _wrapped_function, ref
        return original(self, obj)

    GuardsStatePickler.reducer_override = reducer_override



# What a compiling frame records into its package (torch/_dynamo/convert_frame.py, output_graph.py,
# symbolic_convert.py call these); a failure there is a failure to package, never a failure to compile.
_RECORDERS = ("add_guarded_code", "add_inlined_source", "update_device_type", "add_resume_function",
              "add_import_source", "add_backend_id")


def _patch_recorders() -> None:
    """In our scope, a package that can't record a frame (torch raising from one of :data:`_RECORDERS`: the
    source of code typed into ``python -`` or ``exec``'d, a file edited since it was imported, ...) leaves that
    frame unpackaged (the package is then not stored: traced in every process, one INFO line) and the compile
    goes on as without warm frames."""
    from torch._dynamo.package import CompilePackage

    def guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def record(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            except Exception as exc:
                if not _in_scope():
                    raise
                log.info("neuron: a frame is not packaged (traced in every process): %s failed (%s: %s)", name,
                         type(exc).__name__, exc)
                self._neuron_unstorable = True
                if getattr(self, "_current_entry", None) is not None:
                    self._current_entry.bypassed = True
                return None

        return record

    for name in _RECORDERS:
        setattr(CompilePackage, name, guarded(name, getattr(CompilePackage, name)))


def _patch_user_function() -> None:
    """A function Dynamo compiles as a frame of its own inside a package (after a graph break) is recorded by
    its qualified name (``CompilePackage._add_user_function``); torch raises ``PackageError`` when the name
    can't be resolved (a function reached through a property: Hugging Face's ``self.loss_function``). In our
    scope that frame is recorded as bypassed instead, so the package is not stored and the model compiles
    as without warm frames."""
    from torch._dynamo.package import CompilePackage, PackageError

    original = CompilePackage._add_user_function

    def _add_user_function(self: Any, code: types.CodeType) -> None:
        try:
            original(self, code)
        except PackageError as exc:
            if not _in_scope():
                raise
            log.info("neuron: a frame is not packaged (traced in every process): %s", exc)
            module = inspect.getmodule(code)
            self._add_function(code, module.__name__ if module is not None else "<unknown>")
            self._codes[code].bypassed = True

    CompilePackage._add_user_function = _add_user_function


# --------------------------------------------------------------------------------------------
# Wiring


def _is_neuron(backend: Any) -> bool:
    neuron_backend = _OURS[0]()  # handed over by install(): this module does not import the backend
    backend = getattr(backend, "compiler_fn", backend)  # torch.compile's _TorchCompileWrapper
    if isinstance(backend, str):
        try:
            from torch._dynamo.backends.registry import lookup_backend

            backend = lookup_backend(backend)
        except Exception:
            return False
    return backend is neuron_backend or getattr(backend, "func", None) is neuron_backend


def _eligible(backend: Any) -> bool:
    """Whether this compile's frames may be packaged and loaded: the cache is on, and neither check mode,
    eager fallback nor debug dumps are asked for (globally or in ``torch.compile(options=...)``): those
    need the backend to run on every graph, as the warm-start path itself does (``warm_start.warm_key``)."""
    from neuron_compile.cache.store import CacheStore
    from neuron_compile.config import config

    options = dict(getattr(backend, "kwargs", {}).get("options") or {})
    try:
        with config.patch(**{k: v for k, v in options.items() if k in ("check", "fallback", "debug_dir")}):
            needs_graphs = bool(config.check) or config.fallback == "eager" or bool(config.debug_dir)
    except Exception:  # a bad option: the backend reports it, as without warm frames
        return False
    return not needs_graphs and CacheStore.default() is not None


def _scoped(callback: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        with _precompile_scope():
            return callback(*args, **kwargs)

    run.__dict__.update(getattr(callback, "__dict__", {}))  # _torchdynamo_orig_backend and friends
    return run


def _optimize(*args: Any, **kwargs: Any) -> Any:
    original = _ORIGINAL["optimize"]
    backend = kwargs.get("backend", args[0] if args else None)
    if not enabled() or not _is_neuron(backend) or kwargs.get("disable") or torch._dynamo.config.caching_precompile:
        return original(*args, **kwargs)
    if not _eligible(backend):
        return original(*args, **kwargs)
    from torch._dynamo.eval_frame import OptimizeContext

    with _precompile_scope():
        ctx = original(*args, **kwargs)
    if type(ctx) is not OptimizeContext or getattr(ctx, "_package", None) is None:
        return ctx
    ctx.callback = _scoped(ctx.callback)
    ctx.__class__ = _NeuronOptimizeContext
    ctx.neuron_plain = lambda: original(*args, **kwargs)  # the same compile without a package (see below)
    return ctx


def _has_python_code(fn: Any) -> bool:
    """Whether what ``torch.compile`` wraps (a function, or a module's forward) is Python code a package can be
    tied to; torch's caching precompile fails on anything else (``torch.compile(torch.mm)``: a builtin)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    inner = torch._dynamo.eval_frame.innermost_fn(target)
    return isinstance(getattr(inner, "__code__", None), types.CodeType)


def _context_class() -> type:
    from torch._dynamo.eval_frame import OptimizeContext

    class NeuronOptimizeContext(OptimizeContext):
        """An ``OptimizeContext`` whose wrapping of a function (package load) runs in the precompile scope."""

        def __call__(self, fn: Any) -> Any:
            if not _has_python_code(fn):  # nothing to package: the ordinary compile, traced in every process
                return self.neuron_plain()(fn)
            with _precompile_scope():
                return super().__call__(fn)

    return NeuronOptimizeContext


_NeuronOptimizeContext: Any = None


_OURS: list[Callable[[], Any]] = []  # returns the backend function our packages belong to


def install(backend: Callable[[], Any]) -> None:
    """Wire the package store and the ``torch.compile`` hook in (idempotent; a no-op when torch lacks them).
    ``backend`` returns the Dynamo backend function whose frames are packaged (the backend calls this at import)."""
    global _NeuronOptimizeContext
    if _ORIGINAL:
        return
    if not supported():
        log.info("warm frames are off with torch %s (verified with %s): warm starts trace the frame again",
                 torch.__version__, ", ".join(v + "x" for v in VERIFIED_TORCH))
        return
    _OURS[:] = [backend]
    try:
        import torch._dynamo.package as package
        from torch._dynamo import eval_frame
        from torch._dynamo.precompile_context import BackendCacheArtifact  # noqa: F401

        if not hasattr(torch._dynamo.config, "caching_precompile") or not hasattr(package, "DynamoCache") \
                or not hasattr(eval_frame, "OptimizeContext"):
            raise AttributeError("caching_precompile, DynamoCache or OptimizeContext")
    except (ImportError, AttributeError) as exc:
        log.debug("warm frames unavailable with this torch (%s)", exc)
        return
    _NeuronOptimizeContext = _context_class()
    _ORIGINAL["optimize"] = torch._dynamo.optimize
    _ORIGINAL["DynamoCache"] = package.DynamoCache
    package.DynamoCache = NeuronDynamoCache(package.DynamoCache)
    torch._dynamo.optimize = _optimize
    try:
        _patch_guard_pickler()
    except (ImportError, AttributeError) as exc:
        log.debug("warm frames: decorated functions' guards stay unpicklable with this torch (%s)", exc)
    try:
        _patch_user_function()
    except (ImportError, AttributeError) as exc:
        log.debug("warm frames: graph breaks into unnamed functions fail to compile with this torch (%s)", exc)
    try:
        _patch_recorders()
    except (ImportError, AttributeError) as exc:
        log.debug("warm frames: a frame torch can't package fails to compile with this torch (%s)", exc)
    from neuron_compile import warm_guards

    try:
        warm_guards.install(_in_scope)
    except (ImportError, AttributeError) as exc:  # without its guard repairs a package could skip a guard: undo
        log.info("warm frames are off: torch's guard builder is not the one they were written for (%s)", exc)
        package.DynamoCache = _ORIGINAL.pop("DynamoCache")
        torch._dynamo.optimize = _ORIGINAL.pop("optimize")
        _ORIGINAL.clear()
        return
    logging.getLogger("torch._dynamo.output_graph").addFilter(_Bypassed())


class _Bypassed(logging.Filter):
    """torch logs "Detected a package bypass" at WARNING when a frame can't be packaged (in our scope: a
    guard with no fingerprint, :mod:`neuron_compile.warm_guards`); that frame is then traced in every
    process, as without warm frames, which is not the user's problem: one INFO line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _in_scope() or not str(record.msg).startswith("Detected a package bypass"):
            return True
        log.info("neuron: a frame is not packaged (traced in every process): %s", record.getMessage())
        return False
