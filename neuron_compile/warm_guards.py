"""Identity guards a Dynamo package can carry to another process (what makes warm frames safe).

torch 2.13 and 2.14's caching precompile (see :mod:`neuron_compile.warm_frames`) cannot serialize a guard on
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
  functions recursively); a code object by the same hash; a primitive by value and a plain object (a
  config: a dataclass, a Hugging Face ``PretrainedConfig``, a dict of options) by its class's name and a
  digest of its whole state, both only when the identity was used by ``copy.deepcopy`` (its memo's key),
  with the identity relations between such objects kept (:func:`portable_guards`).

When a package is loaded, a fingerprint that can be settled then becomes one of torch's C++ guards
(a constant by value; an object reached from the frame's globals, or named by the fingerprint, by
identity with the object found now); the rest (values reached from the frame's locals) are checked by a
Python lambda guard on every call, which computes a fingerprint once per new object and then compares
identities. A guard whose object has no fingerprint (an ``nn.Module`` instance's identity, a dict
version, a weak reference, a local class, an object holding a tensor, an ``id()`` used in user code...)
makes the frame *unpackaged*: its package entry is bypassed (and a package with a bypassed entry is never
stored) so the frame is traced in every process, as without warm frames.

Also repaired here: guards reading a module Dynamo installed as a global by id (``type(tensor)`` makes it
read ``G['_<id>_c0'].Tensor``) get that module restored in the loading process (:func:`_keep_installed_modules`).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import enum
import functools
import hashlib
import importlib
import itertools
import logging
import os
import pickle
import re
import struct
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

# Guards torch 2.13 and 2.14 won't serialize (the same set in both: CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES).
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
    named = _typing_name(value)
    if named is not None:
        return ("named", *named)
    return state_fingerprint(value)


def _typing_name(value: Any) -> tuple[str, str] | None:
    """(module, name) of a ``typing`` singleton (``typing.Any``, ``typing.Optional``: a ``_SpecialForm`` has
    no qualified name but is its module's attribute), else None."""
    if type(value).__module__ not in ("typing", "typing_extensions"):
        return None
    module = getattr(value, "__module__", None)
    name = getattr(value, "_name", None) or getattr(value, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str) or module not in sys.modules:
        return None
    return (module, name) if getattr(sys.modules[module], name, None) is value else None


# --------------------------------------------------------------------------------------------
# Plain objects (configs, dataclasses, dicts...): their type by name plus a digest of their whole state

STATE = "state"  # the first field of a fingerprint computed from an object's state (not its name)
_STATE_DEPTH = 8  # how deep nested containers/objects are followed
_STATE_ITEMS = 20_000  # values digested per object at most (a bigger object keeps the refusal)
_MUTABLE = (list, dict, set)  # containers whose identity can matter (aliasing) as a plain object's does


def state_fingerprint(value: Any) -> tuple[Any, ...]:
    """``(STATE, module, qualname, digest)`` of a plain object: an instance of a class reachable by its
    qualified name whose state is its ``__dict__``/``__slots__`` (no C-level storage), or a builtin
    container, holding only primitives, enums, containers, torch dtypes/devices/sizes, named objects
    (modules, classes, functions) and nested such objects. A Hugging Face ``PretrainedConfig``, a dataclass,
    a dict of options. Anything else (a tensor, an ``nn.Module``, a lock, a NumPy array...) raises
    Unfingerprintable: its identity stays uncheckable in another process."""
    module, qualname = _state_owner(value)
    digest = _StateDigest()
    digest.add(value, _STATE_DEPTH)
    return (STATE, module, qualname, digest.hexdigest())


def _state_owner(value: Any) -> tuple[str, str]:
    cls = type(value)
    if cls in (tuple, list, dict, set, frozenset):
        return "builtins", cls.__qualname__
    if issubclass(cls, (torch.Tensor, torch.nn.Module)):
        raise Unfingerprintable(f"no identity for a {cls.__module__}.{cls.__qualname__}")
    if not _plain_class(cls):
        raise Unfingerprintable(f"no identity for a {cls.__module__}.{cls.__qualname__} (not a plain Python object)")
    try:
        return _named(cls)
    except Unfingerprintable as exc:
        raise Unfingerprintable(f"no identity for a {cls.__module__}.{cls.__qualname__} ({exc})") from exc


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]


@functools.lru_cache(maxsize=1024)
def _plain_class(cls: type) -> bool:
    """A Python class whose instances keep all their state in ``__dict__`` and slots: the instance size is
    ``object``'s plus one pointer per slot, dict and weakref (a C base would add hidden storage)."""
    if cls.__itemsize__:
        return False
    # a "managed" dict (Python >= 3.11, negative offset) lives before the object and is not counted in its size
    pointers = len(_slot_names(cls)) + (cls.__dictoffset__ > 0) + (cls.__weakrefoffset__ != 0)
    return cls.__basicsize__ == object.__basicsize__ + pointers * _POINTER


_POINTER = struct.calcsize("P")


class _StateDigest:
    """sha256 over a canonical walk of a value: mutable containers and plain objects met twice are written
    as back references, so the digest also records which of them are the same object (aliasing)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.memo: dict[int, int] = {}
        self.alive: list[Any] = []  # keeps every memoized object alive: its id is not reused during the walk
        self.items = 0

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    def put(self, *parts: object) -> None:
        self.h.update(repr(parts).encode() + b"\0")

    def add(self, value: Any, depth: int) -> None:
        self.items += 1
        if self.items > _STATE_ITEMS:
            raise Unfingerprintable(f"more than {_STATE_ITEMS} values in its state")
        if depth < 0:
            raise Unfingerprintable(f"state nested deeper than {_STATE_DEPTH}")
        cls = type(value)
        if cls in _PRIMITIVES:
            return self.put("const", cls.__name__, repr(value))
        # issubclass on the type: isinstance would read ``__class__`` through a config's own __getattribute__
        if issubclass(cls, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return self.put("torch", cls.__name__, str(value))
        if issubclass(cls, (enum.Enum, type, types.ModuleType, types.FunctionType, types.CodeType,
                            types.BuiltinFunctionType, types.MethodDescriptorType)):
            return self.put("named", fingerprint(value, _DEPTH))
        if cls in (tuple, frozenset) or cls is torch.Size:
            if cls is frozenset:
                return self.put("frozenset", sorted(_sub_digest(v, depth - 1) for v in value))
            self.put(cls.__name__, len(value))
            for item in value:
                self.add(item, depth - 1)
            return None
        seen = self.memo.get(id(value))
        if seen is not None:
            return self.put("ref", seen)
        module, qualname = _state_owner(value)
        self.memo[id(value)] = len(self.memo)
        self.alive.append(value)
        if cls is list:
            self.put("list", len(value))
            for item in value:
                self.add(item, depth - 1)
        elif cls is dict:
            self.put("dict", len(value))
            for key, item in value.items():
                self.add(key, depth - 1)
                self.add(item, depth - 1)
        elif cls is set:
            self.put("set", sorted(_sub_digest(v, depth - 1) for v in value))
        else:
            self.put("object", module, qualname)
            state = object.__getattribute__(value, "__dict__") if cls.__dictoffset__ else {}
            self.add(dict(state), depth - 1)
            for name in _slot_names(cls):
                try:
                    slot = object.__getattribute__(value, name)
                except AttributeError:
                    self.put("unset", name)
                    continue
                self.put("slot", name)
                self.add(slot, depth - 1)
        return None


def _sub_digest(value: Any, depth: int) -> str:
    """The digest of a set's element on its own (a set's order is per process: elements are sorted by it)."""
    digest = _StateDigest()
    digest.add(value, depth)
    return digest.hexdigest()


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
        # ``type(...) is``: isinstance would read ``__class__`` through a config's own __getattribute__ on
        # every call (10.6 us per guard for a transformers config, 0.5 us this way)
        if type(value) is types.FunctionType:
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
    the guard manager of a loaded package.

    Where the fingerprint can be settled while the package loads, the guard becomes one of torch's own
    C++ leaf guards (no Python call per frame call): a primitive constant by value (None/True/False by
    identity, an int/str/bytes by type and equality), and a value reached from the frame's globals (a
    module, class, builtin, function, the builtins dict...) by identity with the object found there now,
    after checking that object's fingerprint. The others (values reached from the frame's locals) are
    checked on every call by :class:`IdentityCheck`."""
    from torch._C._dynamo.guards import DictGuardManager
    from torch._dynamo.guards import _get_closure_vars, get_verbose_code_parts

    code = f"neuron_identity({guard.name}) == {fp[0]} {' '.join(str(p) for p in fp[1:3])}"
    verbose = get_verbose_code_parts(code, guard)
    manager = builder.get_guard_manager(guard)
    if not isinstance(manager, DictGuardManager):
        if _native(builder, guard, manager, fp, verbose):
            return
        manager.add_lambda_guard(IdentityCheck(fp), verbose, guard.user_stack)
        return
    # A dict's manager takes no lambda guard ("DictGuardManager only supports ID_MATCH as a leaf guard"): the
    # check reads the dict through its source from the root instead (as torch's object aliasing guards do).
    check = IdentityCheck(fp)
    name = f"___neuron_identity_{id(check)}"
    builder.add_python_lambda_leaf_guard_to_root([f"{name}({builder.arg_ref(guard)})"], verbose,
                                                 closure_vars={**_get_closure_vars(), name: check})


_NOT_FOUND = object()


def _by_name(fp: tuple[Any, ...]) -> Any:
    """The object of this process a class, enum member, typing singleton or module fingerprint names (no import),
    else _NOT_FOUND."""
    try:
        if fp[0] == "module":
            found = sys.modules.get(fp[1], _NOT_FOUND)
        elif fp[0] == "named" and fp[1] in sys.modules:
            found = getattr(sys.modules[fp[1]], fp[2])
        elif fp[0] in ("class", "enum") and fp[1] in sys.modules:
            found = _resolve(fp[1], fp[2])
            found = getattr(found, fp[3]) if fp[0] == "enum" else found
        else:
            return _NOT_FOUND
    except AttributeError:
        return _NOT_FOUND
    return found if found is not _NOT_FOUND and matches(found, fp) else _NOT_FOUND


_PINNED: list[Any] = []  # objects whose id() a loaded guard compares with: they must outlive it
_SINGLETONS = {"None": None, "True": True, "False": False}


def _native(builder: Any, guard: Any, manager: Any, fp: tuple[Any, ...], verbose: list[str]) -> bool:
    """Install the check as torch's C++ guard when that is exactly as strict; False when it can't be."""
    if fp[0] == "const":
        kind, text = fp[1], fp[2]
        if text in _SINGLETONS and kind in ("NoneType", "bool"):
            value = _SINGLETONS[text]
            add = manager.add_none_match_guard if value is None else \
                manager.add_true_match_guard if value else manager.add_false_match_guard
            add(verbose, guard.user_stack)
            return True
        if kind in ("int", "str", "bytes", "float"):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):  # nan, inf
                return False
            if type(value).__name__ != kind or repr(value) != text or value == 0.0 and kind == "float":
                return False  # (-0.0 == 0.0: the sign of a float zero is left to the Python check)
            manager.add_type_match_guard(id(type(value)), verbose, guard.user_stack)
            manager.add_equals_match_guard(value, verbose, guard.user_stack)
            return True
        return False
    named = _by_name(fp)
    if named is not _NOT_FOUND:
        _PINNED.append(named)
        manager.add_id_match_guard(id(named), verbose, guard.user_stack)
        return True
    from torch._dynamo.source import AttrSource, get_global_source_name

    if get_global_source_name(guard.originating_source) is None or getattr(builder, "runtime_global_scope", None) \
            is None:
        return False
    from torch._dynamo.guards import _get_closure_vars

    try:
        value = guard.originating_source.get_value({"G": builder.runtime_global_scope, "L": {}},
                                                   _get_closure_vars(), {})
    except Exception:  # not there (yet): the Python check decides at each call
        return False
    if not matches(value, fp):
        return False
    if fp[0] == "code-of":  # CLOSURE_MATCH's meaning: the function's code object, as torch checks it
        value = value.__code__
        manager = builder.get_guard_manager_from_source(AttrSource(guard.originating_source, "__code__"))
    _PINNED.append(value)
    manager.add_id_match_guard(id(value), verbose, guard.user_stack)
    return True


# --------------------------------------------------------------------------------------------
# Serialization: replace or refuse


def _replacement(guard: Any, builder: Any) -> tuple[Any, Any, tuple[Any, ...]]:
    """The serializable guard standing for an identity guard, the guarded value and its fingerprint
    (raises Unfingerprintable)."""
    import dataclasses

    kinds = {guard.create_fn_name(), *(guard.guard_types or ())}
    never = kinds & _NEVER
    if never:
        raise Unfingerprintable(f"{'/'.join(sorted(never))} guard")
    value = builder.get(guard)
    fp = function_code_fp(value) if guard.create_fn_name() == "CLOSURE_MATCH" else fingerprint(value)
    if fp[0] in ("const", STATE) and not _identity_used_as_key(guard):
        where = _guard_site(guard)
        raise Unfingerprintable(f"a {type(value).__qualname__} whose identity is used at {where}: only its value can be "
                                "checked in another process, and the id() or hash() used there may be in the result")
    portable = dataclasses.replace(guard, create_fn=functools.partial(NEURON_IDENTITY_MATCH, fp=fp), guard_types=None,
                                   code_list=None, obj_weakref=None, guarded_class_weakref=None, _hash=None)
    return portable, value, fp


def _guard_site(guard: Any) -> str:
    frames = list(guard.user_stack or ())
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "an unknown place"


def _identity_used_as_key(guard: Any) -> bool:
    """Whether Dynamo guarded this object's identity for ``copy.deepcopy`` (the innermost user frame that
    installed the guard is in the standard ``copy`` module): deepcopy uses ``id(x)`` only as its memo's key, so
    a copy of an object with the same state (and the same aliasing, which the state digest and the aliasing
    guards keep) is the same copy. Any other use of an identity (``id(obj)`` in arithmetic, a default
    ``hash`` deciding a set's order...) could put that number into the compiled frame: no value fingerprint
    stands for it."""
    frames = list(guard.user_stack or ())
    return bool(frames) and os.path.realpath(frames[-1].filename) == _COPY_FILE


_COPY_FILE = os.path.realpath(copy.__file__)


def _is_identity(guard: Any) -> bool:
    return bool({guard.create_fn_name(), *(guard.guard_types or ())} & _IDENTITY_TYPES)


def portable_guards(guards: list[Any], builder: Any) -> list[Any]:
    """``guards`` with every identity guard replaced by a NEURON_IDENTITY_MATCH guard (raises
    Unfingerprintable, naming the guard, when one has no fingerprint).

    A state fingerprint names no object, only its contents, so the objects guarded that way keep their
    identity relations explicitly: two sources that held the same object get an aliasing guard (they must
    hold one object in the loading process too), and two sources that held distinct objects with equal
    state can't be told apart in another process (raises): Dynamo's ID_MATCH guards may have told them apart
    (an object used as a dict key, ``id()`` in a memo...)."""
    out = []
    by_id: dict[int, list[Any]] = {}
    by_state: dict[tuple[Any, ...], Any] = {}
    alive = []  # the values grouped by id() stay referenced while grouping
    for guard in guards:
        if not _is_identity(guard):
            out.append(guard)
            continue
        try:
            portable, value, fp = _replacement(guard, builder)
        except Exception as exc:  # Unfingerprintable, or the value can't even be read: not packaged either way
            raise Unfingerprintable(f"guard {guard.create_fn_name()} on {guard.name} can't be checked in another "
                                    f"process ({exc})") from exc
        out.append(portable)
        if fp[0] != STATE:
            continue
        alive.append(value)
        sources = by_id.setdefault(id(value), [])
        if not sources:
            first = by_state.setdefault(fp, guard)
            if first is not guard:
                raise Unfingerprintable(f"guard {guard.create_fn_name()} on {guard.name} can't be checked in another "
                                        f"process (a distinct object with the same state is at {first.name})")
        if guard.originating_source not in sources:
            sources.append(guard.originating_source)
    return out + [_same_object(a, b) for sources in by_id.values() for a, b in itertools.pairwise(sources)]


def _same_object(a: Any, b: Any) -> Any:
    """torch's own aliasing guard (``b is a``), as Dynamo installs for one object reached by two sources."""
    from torch._dynamo.guards import GuardBuilder
    from torch._guards import Guard

    return Guard(originating_source=a, create_fn=functools.partial(GuardBuilder.DUPLICATE_INPUT, source_b=b))


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


# Dynamo's names for globals it installs by object (``OutputGraph.install_global_by_id``: prefix, id, compile id)
_BY_ID = re.compile(r"^\w*_\d+_c\d+$")


def _keep_installed_modules(manager: Any, guards: list[Any], output_graph: Any) -> None:
    """Record, as the package's import sources, the modules Dynamo installed as globals by id that guards read.

    ``type(t)`` of a tensor makes Dynamo install ``torch`` as a global ``_<id>_c<n>`` and guard
    ``G['_<id>_c<n>'].Tensor`` (``BuiltinVariable.call_type``, torch/_dynamo/variables/builtin.py); the
    package restored only the globals its bytecode loads, so in a loading process that guard read a missing
    global and failed on every call: BERT's frame was traced again in every warm process."""
    from torch._dynamo.source import get_global_source_name

    package = getattr(output_graph, "package", None)
    scope = getattr(output_graph, "global_scope", None)
    if package is None or getattr(package, "_current_entry", None) is None or not isinstance(scope, dict):
        return
    names = {get_global_source_name(g.originating_source) for g in guards}
    names |= set(getattr(manager, "additional_used_global_vars", ()))
    for name in sorted(n for n in names if isinstance(n, str) and _BY_ID.match(n)):
        value = scope.get(name)
        if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value:
            package.add_import_source(name, value.__name__)


_UNPICKLABLE = (RuntimeError, pickle.PicklingError, AttributeError, NotImplementedError)


def _serialize(serialize: Any, manager: Any, builder: Any, guards: list[Any], output_graph: Any) -> bytes:
    try:
        portable = portable_guards(guards, builder)
        _keep_builtins(manager, [g for g in guards if _is_identity(g)], output_graph)
        _keep_installed_modules(manager, guards, output_graph)
        try:
            return serialize(manager, builder, portable, output_graph)
        except TypeError as exc:  # torch's refusal of a guard on a local class ("defined in local scope")
            local = re.match(r"Type (<class '[^']*'>)", str(exc))
            raise Unfingerprintable(f"a guard on a {local.group(1) if local else 'value'} can't be saved: "
                                    f"{'its class is defined in local scope' if local else exc}") from exc
        except _UNPICKLABLE as exc:  # e.g. a module with parametrizations (weight_norm) refuses to be pickled
            raise Unfingerprintable(f"the guards' state can't be saved ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
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
        try:
            return serialize(manager, builder, [g for g in guards if not _is_identity(g)], output_graph)
        except (TypeError, *_UNPICKLABLE):  # again: the entry is bypassed, so these bytes are never read or stored
            return b""


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
