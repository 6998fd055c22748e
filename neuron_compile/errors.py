"""The project's exception hierarchy.

Every error a user can see derives from :class:`NeuronCompileError`. Each message says what failed,
where (the user's source line when known) and how to fix it or opt out.
"""

from __future__ import annotations

import re
from typing import Any

import torch


class NeuronCompileError(Exception):
    """Base class of every error raised by neuron-compile."""


class ConfigError(NeuronCompileError, ValueError):
    """A configuration value (env var, option or ``config.patch``) is invalid."""


class UnsupportedOpError(NeuronCompileError):
    """A graph contains ops (or dtypes, or tensor kinds) the backend cannot lower.

    ``unsupported`` lists one human-readable line per offending node.
    """

    def __init__(self, message: str, unsupported: list[str] | None = None) -> None:
        super().__init__(message)
        self.unsupported = list(unsupported or [])


class DynamicShapeError(NeuronCompileError):
    """A symbolic (dynamic) shape reached the backend, which compiles static shapes only."""


class LoweringError(NeuronCompileError):
    """A supported op failed to lower (an internal error, or an input outside a rule's limits)."""


class TemplateRenderError(NeuronCompileError):
    """A kernel template failed to render, or rendered source that does not parse."""


class SimulatorError(NeuronCompileError):
    """A kernel misused the simulated NKI API (bad argument, removed name, not implemented)."""


class SimulatorConstraintError(SimulatorError):
    """A kernel violated a hardware constraint that real Trainium (and the NKI compiler) enforce.

    Attributes name the instruction, the operand, the offending value and the limit, so tests and
    tools can inspect them without parsing the message.
    """

    def __init__(self, instruction: str, operand: str, value: object, limit: object, detail: str = "") -> None:
        self.instruction = instruction
        self.operand = operand
        self.value = value
        self.limit = limit
        msg = f"{instruction}: operand '{operand}' = {value!r} violates limit: {limit}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class RemovedAPIError(SimulatorError, AttributeError):
    """A kernel used an NKI name that was removed; the message names its replacement."""


class CacheError(NeuronCompileError):
    """The artifact cache cannot be used as configured (never raised from a compile)."""


class RuntimeExecutionError(NeuronCompileError):
    """A compiled graph failed while running its kernels."""


class InputDeviceError(NeuronCompileError, ValueError):
    """A graph input lives on a device the backend does not run from (``meta``, ``cuda``): compiled graphs take
    CPU tensors, which the runner moves to the NeuronCore (or the simulator reads)."""


class InputRangeError(RuntimeExecutionError, ValueError):
    """A graph input holds values the NeuronCore dtype it runs in cannot represent (int64 beyond int32, float64
    beyond float32's range): raised before any kernel runs, instead of a wrapped or infinite value. ``tensor``: the
    argument that holds them (the backend names it after its source in the user's code)."""

    tensor: object = None


class DistributedCompileError(NeuronCompileError):
    """A graph of a distributed job failed to compile on some rank; every rank raises this same error.

    ``failures`` lists one "rank N: error" line per failing rank.
    """

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        super().__init__(message)
        self.failures = list(failures or [])


class BucketingError(NeuronCompileError, ValueError):
    """A shape-bucketing wrapper refused an input or output it cannot pad or slice safely."""


class DeviceAssertionError(RuntimeExecutionError, RuntimeError):
    """A check the kernels evaluate on device failed (e.g. an integer result outside the int32 range the
    NeuronCore computes in); raised by the runner after the kernels ran, before any output is returned."""


class IndexOutOfRangeError(DeviceAssertionError, IndexError):
    """An index tensor held a value outside the indexed dimension (eager raises IndexError there too)."""


class LinAlgDeviceError(DeviceAssertionError, torch.linalg.LinAlgError):
    """A factorization failed on device (singular matrix, not positive-definite): eager raises
    ``torch.linalg.LinAlgError`` there too."""


def device_check_error(kind: str) -> type[DeviceAssertionError]:
    """The exception a failed device check of ``kind`` raises (``lowering.ir.DeviceCheck.kind``)."""
    return {"index": IndexOutOfRangeError, "linalg": LinAlgDeviceError}.get(kind, DeviceAssertionError)


UNKNOWN_SOURCE_LINE = "<unknown source line>"
SOURCE_LINE_META = "neuron_source_line"  # a node rebuilt from a stored graph carries its location here


def source_line(node: Any) -> str:
    """The user's source line for a node, from Dynamo's stack trace ('file:line: code')."""
    stored = node.meta.get(SOURCE_LINE_META)
    if isinstance(stored, str):
        return stored
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            loc = lines[i]
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            try:
                file_part, line_part = loc.split(", line ")[:2]
                path = file_part[len('File "'):].rstrip('"')
                lineno = line_part.split(",")[0]
                return f"{path}:{lineno}: {code}".rstrip(": ")
            except ValueError:
                return loc
    return _module_location(node) or UNKNOWN_SOURCE_LINE


def _module_location(node: Any) -> str | None:
    """Where a node without a stack trace comes from: Dynamo records none inside torch's own modules
    (``torch.compile(nn.Bilinear(...))``), but it does record the module the op ran in."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}  # fwd_: a backward op
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    name = re.sub(r"^L\['([^']*)'\]", r"\1", str(path))
    kind = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)
    return f"module {name} ({kind}: torch's own code, no user source line)"
