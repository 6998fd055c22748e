"""Run PyTorch's ModuleInfo database (``torch.nn`` modules) through ``torch.compile(backend="neuron")``.

``python tests/modules/sweep.py [--workers N] [--samples K] [--modules nn.Conv2d,...] [--grad] [--json out.json]``

Every sample of a module (constructor arguments + forward inputs) builds the module twice from one seed: one
copy runs eager, the other is compiled. Both run in training and in eval mode when the module's modes differ.
``--grad`` also compares the gradients of every parameter and differentiable input. Each module is classified
as in the OpInfo sweep: ``pass``, ``refused`` (an UnsupportedOpError/DynamicShapeError names the op), ``crash``
or ``wrong``. Modules run in worker processes so a crash or a hang in one cannot stop the sweep.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opinfo"))
from harness import _compare, _rounding_only, add_common_options, run_pool, write_json  # noqa: E402  (the OpInfo sweep's)

NONDETERMINISTIC: set[str] = set()  # modules whose outputs depend on random draws made inside forward


def _refusal(exc: BaseException) -> str | None:
    """The refusal's first line when ``exc`` (or an exception it was raised from) is our refusal, else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in ("UnsupportedOpError", "DynamicShapeError"):
            lines = str(seen).splitlines()
            return lines[1] if len(lines) > 1 else lines[0][:200]
        seen = seen.__cause__ or seen.__context__
    return None


def _clone(x: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) else t, x)


def _grads(module: Any, outputs: Any, args: Any, kwargs: Any) -> list[Any]:
    """Gradients of ``outputs`` against seeded cotangents, for every parameter then every differentiable input."""
    import torch
    from torch.utils._pytree import tree_flatten

    outs = [o for o in tree_flatten(outputs)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [p for p in module.parameters() if p.requires_grad]
    wrt += [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not wrt:
        return []
    gen = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]
    return list(torch.autograd.grad(outs, wrt, cots, allow_unused=True))


def _rounding_only_module(ref: Any, args: Any, kwargs: Any, actual: Any, expected: Any, why: str) -> str | None:
    """The OpInfo sweep's bf16 rule for a module: a result that differs from eager only by eager's per-op
    rounding passes when its error against a float64 run of the module is at most twice eager's."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

    def call(*ts: Any) -> Any:
        f = list(flat)
        for i, t in zip(where, ts, strict=True):
            f[i] = t
        a, k = tree_unflatten(f, spec)
        return copy.deepcopy(ref).double()(*a, **k)

    return _rounding_only(call, [flat[i] for i in where], actual, expected, why)


def run_module(name: str, samples: int, dtype_name: str, grad: bool = False) -> dict[str, Any]:
    import warnings

    import torch
    import torch._dynamo
    from torch.testing._internal.common_modules import module_db

    import neuron_compile  # noqa: F401
    from neuron_compile.config import config

    warnings.filterwarnings("ignore")
    torch._dynamo.config.cache_size_limit = 64
    dtype = getattr(torch, dtype_name)
    info = next(m for m in module_db if m.name == name)
    result: dict[str, Any] = {"module": name, "status": "pass", "detail": "", "samples": 0}
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
    modes = (True, False) if info.train_and_eval_differ else (True,)
    with config.patch(cache=False):
        for training in modes:
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=grad,
                                                 training=training)
            except Exception as exc:
                result.update(status="n/a", detail=f"samples: {exc}")
                return result
            for sample in inputs[:samples]:
                if sample.forward_input is None:
                    continue
                c_args, c_kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
                f_args, f_kwargs = sample.forward_input.args, sample.forward_input.kwargs
                try:
                    torch.manual_seed(0)
                    eager_m = info.module_cls(*c_args, **c_kwargs).to(dtype=dtype)
                    eager_m.train(training)
                    ours_m = copy.deepcopy(eager_m)
                    ref_m = copy.deepcopy(eager_m)  # a float64 reference for bf16 results (state before forward)
                    e_args, e_kwargs = _clone(f_args), _clone(f_kwargs)
                    torch.manual_seed(0)
                    expected = eager_m(*e_args, **e_kwargs)
                    if grad:
                        expected = (expected, _grads(eager_m, expected, e_args, e_kwargs))
                except Exception:
                    continue  # eager itself rejects the sample
                torch._dynamo.reset()
                o_args, o_kwargs = _clone(f_args), _clone(f_kwargs)
                compiled = torch.compile(ours_m, backend="neuron", dynamic=False)
                try:
                    torch.manual_seed(0)
                    actual = compiled(*o_args, **o_kwargs)
                    if grad:
                        actual = (actual, _grads(ours_m, actual, o_args, o_kwargs))
                except Exception as exc:
                    why = _refusal(exc)
                    if why is not None:
                        result.update(status="refused", detail=why, sample=sample.desc)
                        return result
                    tb = traceback.format_exc().strip().splitlines()
                    result.update(status="crash", detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                                  sample=f"{sample.desc} training={training}", trace=tb[-6:])
                    return result
                if name not in NONDETERMINISTIC:
                    why = _compare(actual, expected, atol, rtol)
                    if why is not None and dtype in (torch.bfloat16, torch.float16) and not grad:
                        why = _rounding_only_module(ref_m, f_args, f_kwargs, actual, expected, why)
                    if why is None and training:  # running statistics (BatchNorm, InstanceNorm) update alike
                        why = _compare(list(ours_m.buffers()), list(eager_m.buffers()), atol, rtol)
                    if why is not None:
                        result.update(status="wrong", detail=why, sample=f"{sample.desc} training={training}")
                        return result
                result["samples"] += 1
    if result["samples"] == 0:
        result.update(status="n/a", detail="no sample eager accepts")
    return result


def _worker(args: tuple[str, int, str, bool]) -> dict[str, Any]:
    try:
        return run_module(*args)
    except Exception as exc:  # the harness itself
        return {"module": args[0], "status": "crash", "detail": f"harness: {exc!r}"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p, samples=1000, timeout=600.0)
    p.add_argument("--modules", default="")
    p.add_argument("--grad", action="store_true", help="also compare the gradients of parameters and inputs")
    a = p.parse_args(argv)
    os.environ.setdefault("NEURON_COMPILE_CACHE", "0")
    from torch.testing._internal.common_modules import module_db

    wanted = set(a.modules.split(",")) if a.modules else None
    todo = [m.name for m in module_db if not wanted or m.name in wanted]
    start = time.time()
    results = run_pool(_worker, [(t, (t, a.samples, a.dtype, a.grad)) for t in todo], a.workers, a.timeout,
                       lambda t: {"module": t, "status": "crash", "detail": "timeout"},
                       lambda r: f"{r['status']:8s} {r['module']:30s} {r.get('samples', 0):3d} "
                                 f"{str(r.get('detail'))[:160]}", per_child=10)
    counts = Counter(r["status"] for r in results)
    print(f"\nall: {dict(counts)}  ({time.time() - start:.0f} s)")
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
