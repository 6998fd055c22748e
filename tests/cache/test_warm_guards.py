"""The fingerprints that stand for identity guards in a Dynamo package (neuron_compile.warm_guards).

In-process: what counts as "the same object" in another process (a module by name, a class or enum
member by qualified name, a builtin by name and binding, a function by its code, globals' module,
defaults and closure), what has no fingerprint, and a frame whose guard has none is not packaged.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib.util
import json
import logging
import math
import threading
import typing
from pathlib import Path

import pytest
import torch

from neuron_compile import warm_guards
from neuron_compile.warm_guards import IdentityCheck, Unfingerprintable, fingerprint, matches


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def _twice(x: int) -> int:
    return x * 2


def _make(k: int, act: object) -> object:
    def inner(x: int) -> object:
        return (act, x * k)

    return inner


class _Tag:
    pass


@dataclasses.dataclass
class _Holder:
    value: object


@dataclasses.dataclass
class _Sub:
    depth: int = 2
    names: list = dataclasses.field(default_factory=lambda: ["a", "b"])


@dataclasses.dataclass
class _Config:  # a plain config: primitives, a tuple, a dict, an enum, a dtype, a nested config
    hidden: int = 8
    act: str = "gelu"
    eps: float = 1e-5
    sizes: tuple = (1, 2)
    extra: dict = dataclasses.field(default_factory=lambda: {"k": 1.0, "tags": {"x", "y"}})
    color: Color = Color.RED
    dtype: torch.dtype = torch.float32
    sub: _Sub = dataclasses.field(default_factory=_Sub)


class _Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: object, b: object = None) -> None:
        self.a, self.b = a, b


_TAG = _Tag()


def _uses_identity(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if id(_TAG) > 0 else x  # id() of a plain object: Dynamo guards that object's identity


def test_fingerprints_tell_objects_apart() -> None:
    assert matches(math, fingerprint(math)) and not matches(enum, fingerprint(math))
    assert matches(Color, fingerprint(Color)) and not matches(IdentityCheck, fingerprint(Color))
    assert matches(Color.RED, fingerprint(Color.RED)) and not matches(Color.BLUE, fingerprint(Color.RED))
    assert matches(torch.relu, fingerprint(torch.relu)) and not matches(torch.tanh, fingerprint(torch.relu))
    assert not matches(lambda x: x, fingerprint(torch.relu))  # a builtin monkeypatched by a Python function
    assert matches(dict.__getitem__, fingerprint(dict.__getitem__))
    assert matches(_twice, fingerprint(_twice)) and matches(_twice.__code__, fingerprint(_twice.__code__))

    lam = lambda x: x * 2  # noqa: E731 (same body as _twice, another function)
    assert not matches(lam, fingerprint(_twice))
    # Closures: recreated with equal values are the same; another int or function in a cell is not.
    assert matches(_make(2, torch.relu), fingerprint(_make(2, torch.relu)))
    assert not matches(_make(3, torch.relu), fingerprint(_make(2, torch.relu)))
    assert not matches(_make(2, torch.tanh), fingerprint(_make(2, torch.relu)))
    # CLOSURE_MATCH's meaning: the code only.
    assert matches(_make(3, torch.tanh), warm_guards.function_code_fp(_make(2, torch.relu)))
    # typing singletons (huggingface_hub's validators key a dict by them: whisper): named by their module
    assert fingerprint(typing.Optional) == ("named", "typing", "Optional")
    assert matches(typing.Union, fingerprint(typing.Union)) and not matches(typing.Union, fingerprint(typing.Optional))
    assert warm_guards._by_name(fingerprint(typing.Union)) is typing.Union


def test_what_has_no_fingerprint() -> None:
    class Local:
        pass

    with pytest.raises(Unfingerprintable, match="no identity for a torch.Tensor"):
        fingerprint({"w": torch.ones(2)})  # a container holding a tensor: its state is not a value
    with pytest.raises(Unfingerprintable, match=r"no identity for a _thread.lock \(not a plain Python object\)"):
        fingerprint(_Holder(threading.Lock()))
    with pytest.raises(Unfingerprintable, match="bound to an instance"):
        fingerprint([].append)
    with pytest.raises(Unfingerprintable, match="not reachable by a qualified name"):
        fingerprint(Local)
    with pytest.raises(Unfingerprintable, match="no identity for a torch.nn.modules.linear.Linear"):
        fingerprint(torch.nn.Linear(2, 2))


def test_state_fingerprints_of_plain_objects() -> None:
    """A plain object's fingerprint is its class by name plus a digest of its whole state: equal for an equal
    object built anew, different for any changed value (nested too), another class, or other aliasing."""
    fp = fingerprint(_Config())
    assert fp[:3] == (warm_guards.STATE, __name__, "_Config")
    assert matches(_Config(), fp) and matches(_Config(extra={"tags": {"y", "x"}, "k": 1.0}), fingerprint(
        _Config(extra={"tags": {"x", "y"}, "k": 1.0})))  # a set's (per-process) order does not count
    for changed in (_Config(hidden=9), _Config(eps=1e-6), _Config(sizes=(1, 2, 3)), _Config(color=Color.BLUE),
                    _Config(dtype=torch.float16), _Config(sub=_Sub(names=["a", "c"])), _Config(act=None),
                    _Config(extra={"k": 1, "tags": {"x", "y"}}), _Holder(1)):  # 1 is not 1.0
        assert not matches(changed, fp), changed
    # Aliasing is part of the state: one list at two places is not two equal lists.
    shared = [1, 2]
    assert fingerprint(_Holder([shared, shared])) != fingerprint(_Holder([[1, 2], [1, 2]]))
    assert matches(_Slotted(1, (2, 3)), fingerprint(_Slotted(1, (2, 3)))) and not matches(
        _Slotted(1), fingerprint(_Slotted(1, (2, 3))))
    assert matches({"a": [1]}, fingerprint({"a": [1]})) and not matches({"a": [2]}, fingerprint({"a": [1]}))
    if importlib.util.find_spec("transformers") is not None:  # what T5 deep-copies in its forward
        from transformers import T5Config

        assert matches(T5Config(d_model=32), fingerprint(T5Config(d_model=32)))
        assert not matches(T5Config(d_model=64), fingerprint(T5Config(d_model=32)))


def test_identity_check_sees_a_function_changed_in_place() -> None:
    """The object that matched once passes on identity, unless its code or defaults were reassigned."""

    def f(x: int, k: int = 2) -> int:
        return x * k

    check = IdentityCheck(fingerprint(f))
    assert check(f) and check(f)
    f.__defaults__ = (3,)
    assert not check(f)
    f.__defaults__ = (2,)
    assert check(f)
    f.__code__ = _twice.__code__.replace(co_name="f")
    assert not check(f)


def test_frame_whose_guard_has_no_fingerprint_is_not_packaged(cache_root: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """``id(obj)`` makes Dynamo guard that object's identity (ID_MATCH on a plain instance): no
    fingerprint, so the frame is not packaged (INFO lines, no WARNING), only the warm-start entry is
    stored, and the result is eager's."""
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    if not warm_frames._ORIGINAL:
        pytest.skip("warm frames are not installed in this process (NEURON_COMPILE_WARM_FRAMES=0)")
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    caplog.set_level(logging.INFO)
    got = torch.compile(_uses_identity, backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(got, _uses_identity(x))
    torch._dynamo.reset()
    kinds = [json.loads(p.read_text())["key_parts"]["kind"] for p in (cache_root / "entries").glob("*/manifest.json")]
    assert "dynamo-frame" not in kinds and "dynamo-inference" in kinds
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("can't be checked in another process" in r.getMessage() for r in caplog.records)


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


def test_check_mode_compiles_are_never_packaged(cache_root: Path) -> None:
    """Check mode (here through ``torch.compile(options=...)``) needs the backend on every graph: its
    frames are neither packaged nor loaded, so a later check-mode run still checks."""
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    if not warm_frames._ORIGINAL:
        pytest.skip("warm frames are not installed in this process (NEURON_COMPILE_WARM_FRAMES=0)")
    torch._dynamo.reset()
    x = torch.randn(3, 5)
    got = torch.compile(_scaled, backend="neuron", dynamic=False, options={"check": True})(x)
    torch.testing.assert_close(got, _scaled(x))
    torch._dynamo.reset()
    kinds = [json.loads(p.read_text())["key_parts"]["kind"] for p in (cache_root / "entries").glob("*/manifest.json")]
    assert kinds == ["inference"]  # the ATen entry only: no warm-start entry, no Dynamo package


def test_warm_frames_only_with_the_torch_they_were_verified_with():
    from neuron_compile import warm_frames

    assert warm_frames.supported("2.13.0+cpu") and warm_frames.supported("2.13.1")
    assert warm_frames.supported("2.14.1+cu130")
    assert not warm_frames.supported("2.15.0") and not warm_frames.supported("2.12.1+cpu")
    assert warm_frames.supported() == torch.__version__.startswith(("2.13.", "2.14."))


def test_builtins_compile_without_a_package(cache_root: Path) -> None:
    """``torch.compile(torch.mm)``: a builtin has no Python code to tie a package to (torch's caching precompile
    fails on it with AttributeError: no ``__code__``), so it compiles the ordinary way, and a Python function
    compiled next to it is still packaged."""
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    if not warm_frames._ORIGINAL:
        pytest.skip("warm frames are not installed in this process (NEURON_COMPILE_WARM_FRAMES=0)")
    torch._dynamo.reset()
    a, b = torch.randn(130, 70), torch.randn(70, 90)
    torch.testing.assert_close(torch.compile(torch.mm, backend="neuron", dynamic=False)(a, b), a @ b,
                               rtol=1e-4, atol=1e-4)
    gelu = torch.nn.functional.gelu
    torch.testing.assert_close(torch.compile(gelu, backend="neuron", dynamic=False)(a), gelu(a), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.compile(_scaled, backend="neuron", dynamic=False)(a), _scaled(a))
    torch._dynamo.reset()
    kinds = sorted(json.loads(p.read_text())["key_parts"]["kind"] for p in (cache_root / "entries").glob("*/manifest.json"))
    assert kinds.count("dynamo-frame") == 1 and kinds.count("dynamo-inference") == 3, kinds


class _Frame:
    """What ``portable_guards`` asks of torch's GuardBuilder: the value a guard's source reads in this frame."""

    def __init__(self, **local: object) -> None:
        self.scope = {"L": local, "G": {}}

    def get(self, guard: object) -> object:
        return guard.originating_source.get_value(self.scope, {}, {})  # type: ignore[attr-defined]


def _id_guard(*path: str, used_in: str = copy.__file__) -> object:
    """An ID_MATCH guard on ``L[path[0]].path[1]...``, installed (as Dynamo records it) at a line of ``used_in``."""
    import traceback

    from torch._dynamo.guards import GuardBuilder
    from torch._dynamo.source import AttrSource, LocalSource
    from torch._guards import Guard

    source = LocalSource(path[0])
    for attr in path[1:]:
        source = AttrSource(source, attr)
    stack = traceback.StackSummary.from_list([traceback.FrameSummary(used_in, 137, "deepcopy")])
    return Guard(source, GuardBuilder.ID_MATCH, user_stack=stack)


def test_state_guards_keep_identity_relations() -> None:
    """Objects fingerprinted by state keep the identity relations the compiling process saw: one object at
    two sources gets torch's aliasing guard (both must hold one object again), two distinct objects with equal
    state are refused (which one is which?), and an identity used outside ``copy`` is refused (its id() may
    be in the result)."""
    from torch._dynamo.guards import GuardBuilder

    shared = _Config()
    guards = warm_guards.portable_guards([_id_guard("a", "value"), _id_guard("b", "value")],
                                         _Frame(a=_Holder(shared), b=_Holder(shared)))
    assert [g.create_fn.func for g in guards[:2]] == [warm_guards.NEURON_IDENTITY_MATCH] * 2
    assert len(guards) == 3 and guards[2].create_fn.func is GuardBuilder.DUPLICATE_INPUT
    assert (guards[2].name, guards[2].create_fn.keywords["source_b"].name) == ("L['a'].value", "L['b'].value")

    with pytest.raises(Unfingerprintable, match=r"on L\['b'\].value .*a distinct object with the same state is at "
                                                r"L\['a'\].value"):
        warm_guards.portable_guards([_id_guard("a", "value"), _id_guard("b", "value")],
                                    _Frame(a=_Holder(_Config()), b=_Holder(_Config())))
    # different states: two fingerprints that can't both match one object, nothing to add
    assert len(warm_guards.portable_guards([_id_guard("a", "value"), _id_guard("b", "value")],
                                           _Frame(a=_Holder(_Config()), b=_Holder(_Config(hidden=4))))) == 2
    with pytest.raises(Unfingerprintable, match=r"a _Config whose identity is used at /src/model.py:137"):
        warm_guards.portable_guards([_id_guard("a", "value", used_in="/src/model.py")], _Frame(a=_Holder(_Config())))


def test_local_class_model_compiles_without_a_package(cache_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A model whose class is defined in a function: torch refuses to save its type guard (TypeError "defined in
    local scope", which crashed the compile); the frame is not packaged (one INFO line) and the result is eager's."""
    import neuron_compile.backend  # noqa: F401
    from neuron_compile import warm_frames

    if not warm_frames._ORIGINAL:
        pytest.skip("warm frames are not installed in this process (NEURON_COMPILE_WARM_FRAMES=0)")

    class Local(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x)) * 2

    torch._dynamo.reset()
    caplog.set_level(logging.INFO)
    model, x = Local().eval(), torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="neuron", dynamic=False)(x), model(x))
    torch._dynamo.reset()
    kinds = [json.loads(p.read_text())["key_parts"]["kind"] for p in (cache_root / "entries").glob("*/manifest.json")]
    assert "dynamo-frame" not in kinds
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("Local'> can't be saved: its class is defined in local scope" in r.getMessage() for r in caplog.records)
