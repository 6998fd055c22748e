"""Render kernel IR as NKI 0.6 source through the Jinja2 templates in ``templates/``.

One template per kernel family extends ``_frame.nki.j2`` (imports, ``@nki.jit`` signature, HBM
outputs in ``nl.shared_hbm``, return). The ``plan_*``/``render_*`` modules compute each family's plan; this
module dispatches a kernel to its family, caches the rendered body per kernel shape and codegen knobs,
chooses the launch grid, and places the body in the frame. Family templates either render the whole kernel
(:func:`_template_context`) or a body block (:func:`render_block`: the loop, copy, gather and index_put
kernels, whose candidate bodies the cost model compares). Every render is compiled as Python; a failure
raises :class:`TemplateRenderError` naming the template, line and kernel.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import replace
from typing import Any

import jinja2
from neuron_compile.lowering.ir import (
    FAMILY_KERNELS,
    AttentionKernel,
    CopyKernel,
    GatherKernel,
    IndexAddKernel,
    Kernel,
    LoopKernel,
)

from neuron_compile.config import config
from neuron_compile.errors import TemplateRenderError
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("neuron_compile.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _macros() -> Any:
    return environment().get_template("_macros.nki.j2").make_module({"pmax": PMAX})


def render_kernel(kernel: Kernel) -> str:
    context = _template_context(kernel)
    if context is not None:  # the template is the whole kernel; Python gives it the plan (one core)
        return _wrap(kernel, "", 1, **context)
    if _is_matmul(kernel):  # the whole kernel too, its M blocks spread over the launch grid
        plan = _matmul_plan(kernel)
        return _wrap(kernel, "", plan["grid"], p=plan, pmax=PMAX)
    body, grid = _cached_body(replace(kernel, name=""), lnc(), _snapshot(), _renderers())
    return _wrap(kernel, body, grid)


def _template_context(kernel: Kernel) -> dict[str, Any] | None:
    """The template context of a kernel whose family template renders the whole kernel (sort, search, scatter,
    line_gather and scan: codegen/render_family.py; conv, conv_wgrad, pool, resample: codegen/render_conv.py), else
    None. These run on one physical core."""
    if isinstance(kernel, FAMILY_KERNELS):
        from neuron_compile.codegen.render_family import family_plan

        return {"k": kernel, "plan": family_plan(kernel), "pmax": PMAX}
    from neuron_compile.codegen.render_conv import TEMPLATE_KERNELS, template_context

    if isinstance(kernel, TEMPLATE_KERNELS):
        return template_context(kernel)
    return None


def launch_grid(kernel: Kernel) -> int:
    """Programs (physical cores) the kernel is launched on: ``lnc()`` when its work splits, else 1."""
    from neuron_compile.codegen.render_conv import TEMPLATE_KERNELS

    if isinstance(kernel, (*FAMILY_KERNELS, *TEMPLATE_KERNELS)):
        return 1
    if _is_matmul(kernel):
        return int(_matmul_plan(kernel)["grid"])
    return _cached_body(replace(kernel, name=""), lnc(), _snapshot(), _renderers())[1]


def _is_matmul(kernel: Kernel) -> bool:
    return isinstance(kernel, LoopKernel) and any(op.opcode == "matmul" for op in kernel.ops)


def _matmul_plan(kernel: Kernel) -> dict[str, Any]:
    """The plan ``matmul.nki.j2`` renders (codegen/plan_matmul.py) on a logical core of ``lnc()`` physical cores."""
    from neuron_compile.codegen.plan_matmul import matmul_plan  # imports this module

    return matmul_plan(kernel, lnc())  # type: ignore[arg-type]


def _snapshot() -> tuple[tuple[str, Any], ...]:
    from neuron_compile.config import codegen_snapshot

    return tuple(sorted(codegen_snapshot().items()))


def lnc() -> int:
    """Physical cores per logical core (config ``lnc``; 0 = the target's default: 2 on trn2/trn3)."""
    return config.lnc or (1 if config.target == "trn1" else 2)


def _renderers() -> tuple[Any, ...]:
    """The renderer entry points (part of the cache key: a test that patches one gets a fresh render)."""
    from neuron_compile.codegen.plan_loop import LoopRenderer

    return (LoopRenderer.__init__, LoopRenderer.body, LoopRenderer.row_group_options)


@functools.lru_cache(maxsize=1024)
def _cached_body(kernel: Kernel, grid: int, snapshot: tuple[tuple[str, Any], ...],
                 renderers: tuple[Any, ...]) -> tuple[str, int]:
    """(body, launch grid) of a kernel with its name taken out: identical kernels (one per transformer layer) render,
    search row groups and choose their launch once per config ``snapshot`` (the codegen knobs)."""
    return _render(replace(kernel, name="k"), grid)


def _render(kernel: Kernel, grid: int) -> tuple[str, int]:
    """(body, launch grid) of a kernel on a logical core of ``grid`` physical cores."""
    if isinstance(kernel, AttentionKernel):  # the plan spreads its batch loop (codegen/plan_attention.py)
        from neuron_compile.codegen.render_attention import attention_body_grid  # imports this module

        return attention_body_grid(kernel, grid)
    if isinstance(kernel, LoopKernel):  # matmul kernels render whole (render_kernel)
        from neuron_compile.codegen.plan_loop import loop_body  # imports this module

        return loop_body(kernel, grid)
    if isinstance(kernel, (CopyKernel, GatherKernel, IndexAddKernel)):
        from neuron_compile.codegen.plan_index import index_body  # imports this module

        return index_body(kernel, grid)
    raise TypeError(kernel)  # pragma: no cover


def _estimate(kernel: Kernel, source: str) -> float:
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import source_stream

    return estimate(source_stream(source, kernel.name, [(a.numel, a.dtype) for a in kernel.inputs]),
                    config.target).time_ns


def render_block(template_name: str, block: str, **context: Any) -> str:
    """One block of a family template rendered on its own: a kernel body (at the frame's indentation level, no final
    newline) that the cost model can compare and :func:`_wrap` places in the frame."""
    template = environment().get_template(template_name)
    try:
        text = "".join(template.blocks[block](template.new_context(context)))
    except jinja2.TemplateError as exc:
        raise TemplateRenderError(f"template {template_name} block {block} failed: {exc}") from exc
    return text[:-1] if text.endswith("\n") else text


def __getattr__(name: str) -> Any:
    """``LoopRenderer`` (codegen/plan_loop.py, which imports this module) stays importable from here."""
    if name == "LoopRenderer":
        from neuron_compile.codegen.plan_loop import LoopRenderer

        return LoopRenderer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _wrap(kernel: Kernel, body: str, grid: int = 1, **context: Any) -> str:
    """The full kernel source around a rendered ``body`` (frame template), checked to be valid Python.

    Family templates (``context`` given: the IR as ``k`` and the plan Python computed for it, plain data)
    override the frame's body block and render the whole kernel.
    """
    template_name = f"{kernel.family}.nki.j2"
    params = [f"in{i}" for i in range(len(kernel.inputs))]
    returns = ", ".join(f"out{i}" for i in range(len(kernel.outputs))) or "None"
    if len(kernel.outputs) > 1:
        returns = f"({returns})"
    doc = f"{kernel.family} kernel: " + ", ".join(dict.fromkeys(kernel.source_ops)) if kernel.source_ops else kernel.family
    try:
        source = environment().get_template(template_name).render(
            name=kernel.name, params=params, outputs=kernel.outputs, body=body, returns=returns, doc=doc, grid=grid,
            **context)
    except jinja2.TemplateError as exc:
        raise TemplateRenderError(f"template {template_name} failed for kernel {kernel.name}: {exc}") from exc
    try:
        _check_syntax(kernel_identity(kernel.name, source))
    except SyntaxError as exc:  # renaming keeps the lines: quote the kernel's own
        line = source.splitlines()[exc.lineno - 1] if exc.lineno else ""
        raise TemplateRenderError(f"template {template_name} rendered invalid Python for kernel {kernel.name} "
                                  f"at line {exc.lineno}: {exc.msg}: {line.strip()!r}") from exc
    return source


def kernel_identity(name: str, source: str) -> str:
    """A kernel's source with its own name taken out (its ``def`` and any mention, e.g. the launch-grid comment):
    equal for identical kernels of different layers."""
    return re.sub(rf"\b{re.escape(name)}\b", "_kernel_", source)


@functools.lru_cache(maxsize=4096)
def _check_syntax(identity: str) -> None:
    """Compile a kernel's source (its name taken out) to check its syntax, at half the cost of building the AST;
    once per distinct kernel (unrolled factorizations render the same kernel hundreds of times under new names).
    Only successes are cached: an exception propagates and is not stored."""
    compile(identity, "<kernel>", "exec", dont_inherit=True)


def _offset(base: int, terms: list[tuple[str, int]]) -> str:
    from neuron_compile.lowering.index_algebra import offset_text  # sympy printer, cached per (base, terms)

    return offset_text(int(base), tuple((var, int(s)) for var, s in terms))
