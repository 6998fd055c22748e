"""Identity guards a Dynamo package can carry to another process (what makes warm frames safe).

torch 2.13's caching precompile (see :mod:`neuron_compile.warm_frames`) cannot serialize a guard on
an object's *identity* (``ID_MATCH`` and what derives from it: ``FUNCTION_MATCH``, ``CLASS_MATCH``,
``MODULE_MATCH``, ``BUILTIN_MATCH``, ``CLOSURE_MATCH``, a ``CONSTANT_MATCH`` on a code object, and
``NN_MODULE``, ``DICT_VERSION``, ``WEAKREF_ALIVE``): an ``id()`` means nothing in another process. So
with ``caching_precompile`` on it silently drops them, in the compiling process too
(``CheckFunctionManager.__init__`` in torch/_dynamo/guards.py), and a model whose global helper
function, module attribute or torch function was rebound after compiling returns stale results.

In our scope (neuron ``torch.compile`` calls) this module changes two things:

- the compiling process keeps every guard torch built (the drop is switched off), so it is exactly
  as correct as without warm frames;
- when a frame's guards are serialized, each identity guard is replaced by a
  ``NEURON_IDENTITY_MATCH`` guard on the same source carrying a *fingerprint* of the object that
  any process can recompute: a module by name; a class or enum member by its qualified name (and
  the class found there must be that object); a builtin by module, qualified name and what it is
  bound to; a Python function by a hash of its code object (bytecode, constants, names, exception
  table, recursively) plus its globals' module, its defaults and closure (primitive values by value,
  functions recursively); a code object by the same hash. The loading process checks it on every
  call (a Python lambda guard on that source). A guard whose object has no fingerprint (an
  ``nn.Module`` instance's identity, a dict version, a weak reference, a local class...) makes the
  frame *unpackaged*: its package entry is bypassed (and a package with a bypassed entry is never
  stored) so the frame is traced in every process, as without warm frames.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

# Guards torch 2.13 won't serialize (CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES).
_IDENTITY_TYPES = frozenset({"DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH",
                             "MODULE_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE"})
_NEVER = frozenset({"DICT_VERSION", "WEAKREF_ALIVE", "NN_MODULE"})  # no fingerprint can stand for these
_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
_DEPTH = 4  # how deep closures/defaults are followed (functions holding functions ...)


class Unfingerprintable(Exception):
    """The object a guard is on has no identity another process could check."""


# --------------------------------------------------------------------------------------------
# Fingerprints (tuples of str/int, picklable, equal across processes for "the same" object)


def code_hash(code: types.CodeType) -> str:
    """sha256 over a code object's behaviour-defining parts (and its definition site: name, file, line)."""
    return _code_hash(code, code.co_filename)  # code objects compare equal across files: the file is in the key


@functools.lru_cache(maxsize=4096)
def _code_hash(code: types.CodeType, filename: str) -> str:
    h = hashlib.sha256()
    for part in (code.co_name, code.co_qualname, filename.rsplit("/", 1)[-1], code.co_firstlineno,
                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                 code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        h.update(repr(part).encode() + b"\0")
    h.update(code.co_code)
    h.update(getattr(code, "co_exceptiontable", b""))
    for const in code.co_consts:
        h.update(b"\1" + _const_repr(const).encode())
    return h.hexdigest()


def _const_repr(const: object) -> str:
    if isinstance(const, types.CodeType):
        return "code:" + code_hash(const)
    if isinstance(const, frozenset):
        return "frozenset:" + ",".join(sorted(_const_repr(c) for c in const))
    if isinstance(const, tuple):
        return "tuple:(" + ",".join(_const_repr(c) for c in const) + ")"
    return f"{type(const).__name__}:{const!r}"


def _resolve(module: str, qualname: str) -> Any:
    found: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _named(obj: Any) -> tuple[str, str]:
    """(module, qualname) of a class (or enum class) that its qualified name reaches, else raises."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        raise Unfingerprintable(f"{obj!r} is not reachable by a qualified name")
    try:
        if _resolve(module, qualname) is not obj:
            raise Unfingerprintable(f"{module}.{qualname} is not {obj!r}")
    except (ImportError, AttributeError) as exc:
        raise Unfingerprintable(f"{module}.{qualname} can't be resolved ({exc})") from exc
    return module, qualname


def fingerprint(value: Any, depth: int = _DEPTH) -> tuple[Any, ...]:
    """What another process checks to decide that a value is "the same object" (raises Unfingerprintable)."""
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.FunctionType):
        return _function_fp(value, depth)
    if isinstance(value, types.CodeType):
        return ("code", code_hash(value))
    if isinstance(value, types.BuiltinFunctionType):
        bound = value.__self__
        if bound is None or isinstance(bound, types.ModuleType):
            owner = getattr(bound, "__name__", None)
        elif isinstance(bound, type):
            owner = ".".join(_named(bound))
        else:
            raise Unfingerprintable(f"builtin {value!r} is bound to an instance")
        return ("builtin", str(value.__module__), value.__qualname__, str(owner))
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)):
        return ("descriptor", ".".join(_named(value.__objclass__)), value.__name__)
    if isinstance(value, type):
        return ("class", *_named(value))
    if isinstance(value, enum.Enum):
        return ("enum", *_named(type(value)), value.name)
    if isinstance(value, _PRIMITIVES):
        return ("const", type(value).__name__, repr(value))
    raise Unfingerprintable(f"no identity for a {type(value).__module__}.{type(value).__qualname__}")


def _function_fp(fn: types.FunctionType, depth: int) -> tuple[Any, ...]:
    cells = tuple(_shallow(c.cell_contents if _cell_full(c) else None, depth) for c in fn.__closure__ or ())
    kwdefaults = tuple(sorted((k, _shallow(v, depth)) for k, v in (fn.__kwdefaults__ or {}).items()))
    return ("function", str(fn.__globals__.get("__name__")), fn.__qualname__, code_hash(fn.__code__),
            tuple(_shallow(d, depth) for d in fn.__defaults__ or ()), kwdefaults, cells)


def _cell_full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def _shallow(value: Any, depth: int) -> tuple[Any, ...]:
    """A default's or closure cell's fingerprint: by value when it has one, else by its type only (Dynamo
    guards what the traced code reads from it through that cell's or default's own source)."""
    if depth <= 0:
        return ("deep", type(value).__qualname__)
    if isinstance(value, (tuple, list)) and len(value) <= 16:
        return (type(value).__name__, tuple(_shallow(v, depth - 1) for v in value))
    try:
        return fingerprint(value, depth - 1)
    except Unfingerprintable:
        return ("object", type(value).__module__, type(value).__qualname__)


def function_code_fp(value: Any) -> tuple[Any, ...]:
    """CLOSURE_MATCH's meaning (torch checks ``fn.__code__`` only): the function's code."""
    if not isinstance(value, types.FunctionType):
        return fingerprint(value)
    return ("code-of", code_hash(value.__code__))


def matches(value: Any, fp: tuple[Any, ...]) -> bool:
    try:
        if fp[0] == "code-of":
            return isinstance(value, types.FunctionType) and code_hash(value.__code__) == fp[1]
        return fingerprint(value) == fp
    except Exception:  # any failure to compute it means "not the same"
        return False


class IdentityCheck:
    """A lambda guard: the value at the guard's source has the fingerprint recorded when compiling.

    The first matching object is remembered (a strong reference, so its id is never reused); the same
    object (with the same code, defaults) passes without recomputing."""

    def __init__(self, fp: tuple[Any, ...]) -> None:
        self.fp = fp
        self.seen: tuple[Any, tuple[Any, ...]] | None = None

    @staticmethod
    def _mutable(value: Any) -> tuple[Any, ...]:
        if isinstance(value, types.FunctionType):
            return (value.__code__, value.__defaults__, value.__kwdefaults__)
        return ()

    def __call__(self, value: Any) -> bool:
        seen = self.seen
        if seen is not None and seen[0] is value:
            now = self._mutable(value)
            if all(a is b for a, b in zip(seen[1], now, strict=True)):
                return True
        if not matches(value, self.fp):
            return False
        self.seen = (value, self._mutable(value))
        return True


def NEURON_IDENTITY_MATCH(builder: Any, guard: Any, fp: tuple[Any, ...]) -> None:  # noqa: N802 (torch's naming)
    """A guard's create_fn (``functools.partial(NEURON_IDENTITY_MATCH, fp=...)``), run when torch builds
    the guard manager of a loaded package."""
    from torch._dynamo.guards import get_verbose_code_parts

    code = f"neuron_identity({guard.name}) == {fp[0]} {' '.join(str(p) for p in fp[1:3])}"
    builder.get_guard_manager(guard).add_lambda_guard(IdentityCheck(fp), get_verbose_code_parts(code, guard),
                                                      guard.user_stack)


# --------------------------------------------------------------------------------------------
# Serialization: replace or refuse


def _replacement(guard: Any, builder: Any) -> Any:
    """The serializable guard standing for an identity guard (raises Unfingerprintable)."""
    import dataclasses

    kinds = {guard.create_fn_name(), *(guard.guard_types or ())}
    never = kinds & _NEVER
    if never:
        raise Unfingerprintable(f"{'/'.join(sorted(never))} guard")
    value = builder.get(guard)
    fp = function_code_fp(value) if guard.create_fn_name() == "CLOSURE_MATCH" else fingerprint(value)
    return dataclasses.replace(guard, create_fn=functools.partial(NEURON_IDENTITY_MATCH, fp=fp), guard_types=None,
                               code_list=None, obj_weakref=None, guarded_class_weakref=None, _hash=None)


def _is_identity(guard: Any) -> bool:
    return bool({guard.create_fn_name(), *(guard.guard_types or ())} & _IDENTITY_TYPES)


def portable_guards(guards: list[Any], builder: Any) -> list[Any]:
    """``guards`` with every identity guard replaced by a NEURON_IDENTITY_MATCH guard (raises
    Unfingerprintable, naming the guard, when one has no fingerprint)."""
    out = []
    for guard in guards:
        if not _is_identity(guard):
            out.append(guard)
            continue
        try:
            out.append(_replacement(guard, builder))
        except Exception as exc:  # Unfingerprintable, or the value can't even be read: not packaged either way
            raise Unfingerprintable(f"guard {guard.create_fn_name()} on {guard.name} can't be checked in another "
                                    f"process ({exc})") from exc
    return out


def _keep_builtins(manager: Any, guards: list[Any], output_graph: Any) -> None:
    """torch serializes only the builtins (``G['__builtins_dict___0']['len']``) its BUILTIN_MATCH guards
    recorded in ``used_builtin_vars``; an ID_MATCH on one (``all``, ``iter`` in GPT-2) is not recorded, so
    rebuilding the guard failed with KeyError in the loading process. Record them."""
    from torch._dynamo.source import DictGetItemSource, GlobalSource

    name = getattr(output_graph, "name_of_builtins_dict_key_in_fglobals", None)
    used = getattr(manager, "used_builtin_vars", None)
    if not name or used is None:
        return
    for guard in guards:
        src = guard.originating_source
        while src is not None:
            if isinstance(src, DictGetItemSource) and isinstance(src.base, GlobalSource) \
                    and src.base.global_name == name:
                used.add(src.index)
            src = getattr(src, "base", None)


def _serialize(serialize: Any, manager: Any, builder: Any, guards: list[Any], output_graph: Any) -> bytes:
    try:
        portable = portable_guards(guards, builder)
        _keep_builtins(manager, [g for g in guards if _is_identity(g)], output_graph)
        return serialize(manager, builder, portable, output_graph)
    except Unfingerprintable as exc:
        # torch's own way out (raising PackageError) ends in an AssertionError in convert_frame when the
        # guards state is None; bypassing the package entry and returning bytes that are never stored does not.
        package = getattr(output_graph, "package", None)
        entry = getattr(package, "_current_entry", None)
        if entry is None or not hasattr(output_graph, "bypass_package"):
            raise torch._dynamo.exc.PackageError(f"neuron: {exc}") from exc
        output_graph.bypass_package(f"neuron: {exc}")
        if not entry.bypassed:
            raise torch._dynamo.exc.PackageError(f"neuron: {exc}") from exc
        return serialize(manager, builder, [g for g in guards if not _is_identity(g)], output_graph)


# --------------------------------------------------------------------------------------------
# Wiring (installed by neuron_compile.warm_frames.install, active only in its scope)


def install(in_scope: Any) -> None:
    """Patch torch's CheckFunctionManager: in our scope no guard is dropped, and identity guards are
    serialized as NEURON_IDENTITY_MATCH guards. ``in_scope()`` says whether a neuron compile is running."""
    from torch._dynamo.guards import CheckFunctionManager

    init, serialize = CheckFunctionManager.__init__, CheckFunctionManager.serialize_guards

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        if not in_scope():
            return init(self, *args, **kwargs)
        with _keep_every_guard():
            return init(self, *args, **kwargs)

    @functools.wraps(serialize)
    def serialize_guards(self: Any, builder: Any, sorted_guards: list[Any], output_graph: Any) -> bytes:
        if not in_scope():
            return serialize(self, builder, sorted_guards, output_graph)
        return _serialize(serialize, self, builder, sorted_guards, output_graph)

    CheckFunctionManager.__init__ = __init__  # type: ignore[method-assign]
    CheckFunctionManager.serialize_guards = serialize_guards  # type: ignore[method-assign]
    _patch_lambda_guards(in_scope)


def _patch_lambda_guards(in_scope: Any) -> None:
    """Python lambda guards (object aliasing ``G['MODE'] is G['FAST']``, symbolic shapes) read globals
    through the dict the builder was given as ``G`` (``GuardBuilder.add_python_lambda_leaf_guard_to_root``,
    torch/_dynamo/guards.py). In the compiling process that is the frame's live globals; in a process
    loading a package it is the *pickled snapshot* of them, so such a guard always passed there
    (measured: ``MODE = SLOW`` after loading returned the ``MODE is FAST`` result). In our scope they
    read the runtime globals, which is what the C++ guards already read."""
    from torch._dynamo.guards import GuardBuilder

    add = GuardBuilder.add_python_lambda_leaf_guard_to_root

    @functools.wraps(add)
    def add_python_lambda_leaf_guard_to_root(self: Any, *args: Any, **kwargs: Any) -> None:
        runtime = getattr(self, "runtime_global_scope", None)
        if not in_scope() or runtime is None or runtime is self.scope["G"]:
            return add(self, *args, **kwargs)
        snapshot, self.scope["G"] = self.scope["G"], runtime
        try:
            return add(self, *args, **kwargs)
        finally:
            self.scope["G"] = snapshot

    GuardBuilder.add_python_lambda_leaf_guard_to_root = add_python_lambda_leaf_guard_to_root  # type: ignore[method-assign]


@contextlib.contextmanager
def _keep_every_guard() -> Iterator[None]:
    """torch drops the guards it can't serialize only while ``caching_precompile`` is on; building the guard
    manager is the one place that reads it, so it is off there (the package is still recorded)."""
    with torch._dynamo.config.patch(caching_precompile=False):
        yield
