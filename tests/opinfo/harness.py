"""Run PyTorch's OpInfo database through ``torch.compile(backend="neuron")`` and classify every op.

Used by ``tests/opinfo/test_opinfo.py`` (one op per test) and as the full sweep:
``python tests/opinfo/harness.py [--workers N] [--samples K] [--dtype float32] [--ops a,b] [--json out.json]``
(``--grad`` compares gradients too; ``--reference`` takes OpInfo's reference inputs beyond the sample inputs)

Each op's first K sample inputs are compiled as a one-op function and compared with eager:
``pass`` (every sample matches), ``refused`` (an UnsupportedOpError/DynamicShapeError names the op, or an
InputRangeError names an input whose values the NeuronCore dtype can't hold),
``crash`` (any other exception), ``wrong`` (a result differs from eager). Ops run in worker
processes so a crash or a hang in one op cannot stop the sweep.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any

SKIP_FAMILIES = ("linalg.", "fft.", "special.")  # reported separately: outside the op surface targeted


ITERATIVE_LINALG = frozenset((
    "linalg.svd", "linalg.svdvals", "svd", "svd_lowrank", "pca_lowrank", "linalg.pinv", "pinverse", "linalg.cond",
    "linalg.matrix_rank", "linalg.matrix_norm", "linalg.norm", "linalg.lstsq", "linalg.eig", "linalg.eigvals",
    "linalg.eigh", "linalg.eigvalsh", "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve",
    "linalg.polar", "linalg.matrix_sqrth"))  # torch 2.14: an SVD and an eigh underneath


def excluded(name: str) -> str | None:
    """Why an op is outside the targeted surface (the iterative linear-algebra decompositions,
    and the ops with an SVD in some of their samples: matrix_norm / norm of ord 2 or nuc), or None. The direct
    methods (LU, solves, inverses, determinants, Cholesky, QR: lowering/decomp_linalg.py, decomp_qr.py) must match
    eager."""
    return "linalg" if name in ITERATIVE_LINALG else None


def _leaves(sample: Any) -> tuple[list[Any], Any]:
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

    def rebuild(*ts: Any) -> Any:
        f = list(flat)
        for i, t in zip(tensors, ts, strict=True):
            f[i] = t
        return tree_unflatten(f, spec)

    return [flat[i] for i in tensors], rebuild


def _compare(actual: Any, expected: Any, atol: float | None, rtol: float | None) -> str | None:
    import torch
    from torch.utils._pytree import tree_flatten

    a_flat, _ = tree_flatten(actual)
    e_flat, _ = tree_flatten(expected)
    if len(a_flat) != len(e_flat):
        return f"{len(a_flat)} outputs, eager has {len(e_flat)}"
    for a, e in zip(a_flat, e_flat, strict=True):
        if (a is None) != (e is None):
            return f"got {type(a).__name__}, eager gives {type(e).__name__}"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"got {type(a).__name__}, eager gives a tensor"
            if a.shape != e.shape or a.dtype != e.dtype:
                return f"got {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
            try:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, check_stride=False)
            except AssertionError as exc:
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                return lines[1] if len(lines) > 1 else str(exc)
        elif isinstance(e, (int, float, bool)) and a != e and not (e != e and a != a):
            return f"got {a!r}, eager {e!r}"
    return None


def run_op(name_variant: tuple[str, str], samples: int, dtype_name: str, strict: bool = False,
           grad: bool = False, reference: bool = False) -> dict[str, Any]:
    import warnings

    import torch
    import torch._dynamo
    from torch.testing._internal.common_methods_invocations import op_db

    import neuron_compile  # noqa: F401
    from neuron_compile.config import config
    from neuron_compile.errors import DynamicShapeError, InputRangeError, UnsupportedOpError

    warnings.filterwarnings("ignore")
    torch._dynamo.config.cache_size_limit = 64
    dtype = getattr(torch, dtype_name)
    name, variant = name_variant
    op = next(o for o in op_db if o.name == name and o.variant_test_name == variant)
    full = f"{name}.{variant}" if variant else name
    result: dict[str, Any] = {"op": full, "status": "pass", "detail": "", "samples": 0}
    if dtype not in op.supported_dtypes("cpu"):
        result.update(status="n/a", detail=f"no {dtype_name} samples")
        return result
    inexact = dtype.is_floating_point or dtype.is_complex
    if grad and (not op.supports_autograd or not inexact or op.name in NONDETERMINISTIC):
        result.update(status="n/a", detail="no gradient")
        return result
    if reference and op.reference_inputs_func is None:
        result.update(status="n/a", detail="no reference inputs")
        return result
    try:
        gen = op.sample_inputs("cpu", dtype, requires_grad=grad)
        skip = 0
        if reference:  # the reference inputs beyond the sample inputs they start with
            skip = sum(1 for _ in gen)
            gen = op.reference_inputs("cpu", dtype, requires_grad=grad)
        todo = []
        for i, s in enumerate(gen):
            if i < skip:
                continue
            todo.append(s)
            if len(todo) >= samples:
                break
    except Exception as exc:
        result.update(status="n/a", detail=f"samples: {exc}")
        return result
    wide = (torch.float32, torch.float64, torch.complex64, torch.complex128)  # (64-bit ones compute in 32 bits)
    atol, rtol = (1e-4, 1e-4) if dtype in wide else (2e-2, 2e-2)
    if strict:  # torch.testing.assert_close's own defaults for the dtype
        atol, rtol = None, None
    with config.patch(cache=False):
        for s in todo:
            leaves, rebuild = _leaves(s)

            def call(*ts: Any, _rebuild: Any = rebuild) -> Any:
                inp, args, kwargs = _rebuild(*ts)
                return op.op(inp, *args, **kwargs)

            try:
                torch.manual_seed(0)
                eager_leaves = _fresh(leaves)
                expected = call(*eager_leaves)
                if grad:
                    expected = (expected, _grads(expected, eager_leaves))
            except Exception:
                continue  # eager itself rejects the sample (or its backward)
            torch._dynamo.reset()
            # The sample's tensors reach the compiled function through its closure (Dynamo makes them graph
            # inputs), so tracing does not walk the pytree rebuild of the sample's structure.
            ours = _fresh(leaves)
            inp, args, kwargs = rebuild(*ours)
            compiled = torch.compile(lambda: op.op(inp, *args, **kwargs),  # noqa: B023 (called in this iteration)
                                     backend="neuron", dynamic=False)
            try:
                torch.manual_seed(0)
                actual = compiled()
                if grad:
                    actual = (actual, _grads(actual, ours))
            except (UnsupportedOpError, DynamicShapeError) as exc:
                result.update(status="refused", detail=str(exc).splitlines()[1:2] or str(exc)[:200])
                return result
            except InputRangeError as exc:  # a sample value the NeuronCore dtype can't hold (int64 past int32)
                result.update(status="refused", detail=f"input range: {str(exc)[:200]}")
                return result
            except Exception as exc:
                tb = traceback.format_exc().strip().splitlines()
                cause = exc
                while cause.__cause__ is not None or cause.__context__ is not None:
                    nxt = cause.__cause__ or cause.__context__
                    if isinstance(nxt, (UnsupportedOpError, DynamicShapeError)):
                        result.update(status="refused", detail=str(nxt).splitlines()[1:2])
                        return result
                    cause = nxt
                if type(cause).__name__ in ("UnsupportedOpError", "DynamicShapeError"):
                    result.update(status="refused", detail=str(cause)[:200])
                    return result
                result.update(status="crash", detail=f"{type(exc).__name__}: {str(exc)[:300]}", trace=tb[-6:])
                return result
            if op.name in NONDETERMINISTIC:
                result["samples"] += 1
                continue
            why = _compare(actual, expected, atol, rtol)
            if why is not None and inexact and not strict:
                why = _rounding_only(call, leaves, actual, expected, why, grad)
            if why is not None and op.name in TIE_ORDER_UNSPECIFIED and not grad:
                why = _tie_order_only(op.name, s, actual, expected, atol, rtol, why)
            if why is not None:
                result.update(status="wrong", detail=why, sample=repr(s)[:300])
                return result
            result["samples"] += 1
    if result["samples"] == 0:
        result.update(status="n/a", detail="no sample eager accepts")
    return result


def _fresh(leaves: list[Any]) -> list[Any]:
    """Copies of a sample's tensors, leaves of their own autograd graph where the sample's require grad."""
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]


def _grads(outputs: Any, leaves: list[Any], via: Any = None) -> list[Any]:
    """Gradients of ``outputs`` against seeded cotangents with respect to the sample's differentiable tensors
    (None for a tensor the outputs do not depend on); ``via``: the dtype the cotangents are rounded to first (a
    float64 reference run takes the low-precision run's cotangents)."""
    import torch
    from torch.utils._pytree import tree_flatten

    outs = [o for o in tree_flatten(outputs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [t for t in leaves if t.requires_grad]
    if not outs or not wrt:
        return []
    gen = torch.Generator().manual_seed(1)
    cots = []
    for o in outs:  # complex outputs take complex cotangents (``via`` rounds real ones only)
        c = torch.randn(o.shape, generator=gen, dtype=torch.complex64 if o.is_complex() else torch.float32)
        cots.append((c if o.is_complex() else c.to(via or o.dtype)).to(o.dtype))
    return list(torch.autograd.grad(outs, wrt, cots, allow_unused=True))


def _wider(dtype: Any) -> Any:
    """float64, or complex128 for a complex dtype (the reference run's)."""
    import torch

    return torch.complex128 if dtype.is_complex else torch.float64


def _rounding_only(call: Any, leaves: list[Any], actual: Any, expected: Any, why: str,
                   grad: bool = False) -> str | None:
    """A result that differs from eager only by rounding: both are compared with the op run in float64 on the same
    inputs (Inductor's opinfo tests compare with a higher-precision reference the same way). Eager rounds every
    intermediate of bf16/fp16 to that dtype where a compiled kernel keeps fp32 inside, and an fp32 algorithm that
    amplifies rounding (matrix_exp's squarings) differs from eager's by more than the default tolerance whichever
    is more accurate; the result passes when its error is at most twice eager's (plus one unit in the last place
    of the largest reference value).
    With ``grad`` the gradients are compared the same way (the float64 run takes the same cotangents)."""
    import torch
    from torch.utils._pytree import tree_flatten

    up = [t.detach().to(_wider(t.dtype)).requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex()
          else t.clone() for t in leaves]
    try:
        torch.manual_seed(0)
        reference = call(*up)
        if grad:
            low = next((t.dtype for t in leaves if t.is_floating_point() or t.is_complex()), None)
            reference = (reference, _grads(reference, up, via=low))
    except Exception:
        return why
    a_flat, e_flat, r_flat = (tree_flatten(x)[0] for x in (actual, expected, reference))
    if len(r_flat) != len(a_flat):
        return why
    for a, e, r in zip(a_flat, e_flat, r_flat, strict=True):
        if isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(a, e):  # integer and bool outputs must match eager exactly
                return why
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(r, torch.Tensor)) or not a.numel():
            continue
        a64, e64, r = (x.to(_wider(x.dtype)) for x in (a, e, r))
        finite, ours_finite = torch.isfinite(r), torch.isfinite(a64)
        if not (torch.equal(ours_finite, finite) or torch.equal(ours_finite, torch.isfinite(e64))):
            return why  # inf / NaN where neither the float64 run nor eager has them
        if not finite.any():
            continue
        ours, eager = ((x - r)[finite].abs().max().item() for x in (a64, e64))
        ulp = torch.finfo(a.dtype).eps * r[finite].abs().max().item()
        if ours > 2 * eager + ulp:
            return f"{why} (error vs a float64 run: {ours:.3g}, eager's {eager:.3g})"
    return None


# Ops whose indices PyTorch leaves unspecified among equal values (CPU's order comes from std::nth_element /
# partial_sort; an unstable sort's, from its algorithm: large bf16 inputs are full of ties): values must match
# eager exactly; indices must select exactly those values from the input (as PyTorch's own test_sort_and_select
# checks topk), not reproduce CPU's tie order.
TIE_ORDER_UNSPECIFIED = {"topk", "kthvalue", "median", "nanmedian", "mode", "sort", "argsort"}


def _tie_order_only(name: str, sample: Any, actual: Any, expected: Any, atol: float, rtol: float,
                    why: str) -> str | None:
    """None when ``actual`` differs from eager only in the (unspecified) indices of equal values."""
    import torch

    if name == "argsort":  # indices only: they must sort the input into the same order of values as eager's
        x, args, kwargs = sample.input, list(sample.args), dict(sample.kwargs)
        if kwargs.get("stable") or actual.shape != expected.shape or x.dim() == 0:
            return why
        dim = args[0] if args else kwargs.get("dim", -1)
        return _compare(torch.gather(x, dim, actual), torch.gather(x, dim, expected), atol, rtol) and why
    values, indices = actual
    if _compare(values, expected[0], atol, rtol) is not None or indices.shape != expected[1].shape:
        return why
    x, args, kwargs = sample.input, list(sample.args), dict(sample.kwargs)
    if name == "sort":  # sort(dim=-1, descending=False, stable=False): only a stable sort fixes the tie order
        if kwargs.get("stable"):
            return why
        dim = args[0] if args else kwargs.get("dim", -1)
    elif name in ("topk", "kthvalue"):
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
    else:  # median/nanmedian without a dim reduce everything (no indices); mode's dim defaults to -1
        dim = args[0] if args else kwargs.get("dim", -1 if name == "mode" else None)
    if dim is None or x.dim() == 0:
        return why if x.dim() else (None if int(indices) == 0 else why)
    keep = indices.dim() == x.dim()
    idx = indices if keep else indices.unsqueeze(dim)
    picked = torch.gather(x, dim, idx)
    picked = picked if keep else picked.squeeze(dim)
    if _compare(picked, values, atol, rtol) is not None:
        return f"{why} (and the indices do not select the values)"
    return None


# Ops whose values are undefined: only the shape and dtype are compared. Random ops are compared like any other:
# eager and the compiled call each start from torch.manual_seed(0), and the runner draws eager's values
# (lowering/ops/random.py).
NONDETERMINISTIC = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def add_common_options(p: argparse.ArgumentParser, samples: int, timeout: float) -> None:
    """The options both sweeps (this one and tests/modules/sweep.py) take."""
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--samples", type=int, default=samples)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default="")
    p.add_argument("--timeout", type=float, default=timeout)


def run_pool(worker: Any, jobs: list[tuple[Any, tuple[Any, ...]]], workers: int, timeout: float,
             on_timeout: Any, show: Any, per_child: int) -> list[dict[str, Any]]:
    """``worker(args)`` for every (key, args) job in spawned worker processes, each result printed as it comes
    (``show(result)``); a job past ``timeout`` seconds is ``on_timeout(key)``."""
    results = []
    with mp.get_context("spawn").Pool(workers, maxtasksperchild=per_child) as pool:
        futs = [(key, pool.apply_async(worker, (args,))) for key, args in jobs]
        for key, f in futs:
            try:
                r = f.get(timeout=timeout)
            except mp.TimeoutError:
                r = on_timeout(key)
            results.append(r)
            print(show(r), flush=True)
    return results


def write_json(path: str, results: list[dict[str, Any]]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def _worker(args: tuple[tuple[str, str], int, str, bool, bool, bool]) -> dict[str, Any]:
    try:
        return run_op(*args)
    except Exception as exc:  # the harness itself
        return {"op": ".".join(x for x in args[0] if x), "status": "crash", "detail": f"harness: {exc!r}"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p, samples=3, timeout=300.0)
    p.add_argument("--ops", default="")
    p.add_argument("--strict", action="store_true", help="torch.testing.assert_close's default tolerances")
    p.add_argument("--grad", action="store_true", help="also compare the gradients of every differentiable input")
    p.add_argument("--reference", action="store_true",
                   help="OpInfo's reference inputs (extremal values, broadcasting, large and odd shapes) instead")
    a = p.parse_args(argv)
    os.environ.setdefault("NEURON_COMPILE_CACHE", "0")
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(a.ops.split(",")) if a.ops else None
    todo = []
    for o in op_db:
        full = f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name
        if wanted and full not in wanted and o.name not in wanted:
            continue
        todo.append((o.name, o.variant_test_name))
    start = time.time()
    results = run_pool(_worker, [(t, (t, a.samples, a.dtype, a.strict, a.grad, a.reference)) for t in todo],
                       a.workers, a.timeout,
                       lambda t: {"op": ".".join(x for x in t if x), "status": "crash", "detail": "timeout"},
                       lambda r: f"{r['status']:8s} {r['op']:45s} {str(r.get('detail'))[:150]}", per_child=20)
    for t, r in zip(todo, results, strict=True):
        r["excluded"] = excluded(t[0])
    counts = Counter(r["status"] for r in results)
    inside = [r for r in results if not r["excluded"] and r["status"] != "n/a"]
    ic = Counter(r["status"] for r in inside)
    print(f"\nall: {dict(counts)}  ({time.time() - start:.0f} s)")
    print(f"outside linalg: {dict(ic)}; pass {ic['pass']}/{len(inside)} = "
          f"{100 * ic['pass'] / max(len(inside), 1):.1f}%")
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
