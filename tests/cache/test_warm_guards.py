"""The fingerprints that stand for identity guards in a Dynamo package (neuron_compile.warm_guards).

In-process: what counts as "the same object" in another process (a module by name, a class or enum
member by qualified name, a builtin by name and binding, a function by its code, globals' module,
defaults and closure), what has no fingerprint, and a frame whose guard has none is not packaged.
"""

from __future__ import annotations

import enum
import json
import logging
import math
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


def test_what_has_no_fingerprint() -> None:
    class Local:
        pass

    with pytest.raises(Unfingerprintable, match="no identity for a builtins.object"):
        fingerprint(object())
    with pytest.raises(Unfingerprintable, match="bound to an instance"):
        fingerprint([].append)
    with pytest.raises(Unfingerprintable, match="not reachable by a qualified name"):
        fingerprint(Local)
    with pytest.raises(Unfingerprintable, match="no identity for a torch.nn.modules.linear.Linear"):
        fingerprint(torch.nn.Linear(2, 2))


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
    assert not warm_frames.supported("2.14.0") and not warm_frames.supported("2.12.1+cpu")
    assert warm_frames.supported() == torch.__version__.startswith("2.13.")


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
