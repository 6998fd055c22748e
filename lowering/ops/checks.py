"""Device-side assertions: ``aten._assert_async.msg(cond, msg)`` becomes a check the runner reads.

The condition is an ordinary 0-d bool value computed by the kernels (for index bounds, an ``all`` over
the index tensor, see :mod:`lowering.graph_checks`); no kernel is emitted for the assertion itself. After
every kernel of the graph ran, the runner reads the flag and raises
:class:`~neuron_compile.errors.IndexOutOfRangeError` (an ``IndexError``, as eager raises) or
:class:`~neuron_compile.errors.DeviceAssertionError` before any output is returned.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.ir import DeviceCheck
from neuron_compile.lowering.registry import register_lowering
from torch import fx

from neuron_compile.errors import source_line

aten = torch.ops.aten
INDEX_PREFIX = "index out of range"
LINALG_PREFIXES = ("linalg.", "torch.linalg.", "cholesky:")  # _linalg_check_errors' messages (decomp_linalg)


@register_lowering(aten._assert_async.msg, family="checks", kind="copy")
def lower_assert_async(gl: Any, node: fx.Node) -> None:
    """aten._assert_async(cond, msg): a device-side check; the runner raises ``msg`` when cond is false."""
    cond, msg = node.args[0], str(node.args[1])
    where = source_line(node)
    text = msg if where == "<unknown source line>" else f"{msg} (at {where})"
    kind = "index" if msg.startswith(INDEX_PREFIX) else "linalg" if msg.startswith(LINALG_PREFIXES) else "assert"
    if not isinstance(cond, fx.Node):
        if not cond:
            from neuron_compile import errors

            raise errors.device_check_error(kind)(text)
        return
    view = gl.view_of(cond)
    gl.checks.append(DeviceCheck(view.buffer, view.offset, text, kind))
