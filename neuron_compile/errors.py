"""The project's exception hierarchy.

Every error a user can see derives from :class:`NeuronCompileError`. Each message says what failed,
where (the user's source line when known) and how to fix it or opt out.
"""

from __future__ import annotations


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


class DeviceCheckError(RuntimeExecutionError, RuntimeError):
    """A check computed on the device failed (e.g. an integer result outside the int32 range NeuronCores hold).

    Kernels that can meet such inputs write a flag output (:class:`~neuron_compile.lowering.ir.Guard`)
    that the runner inspects right after the kernel, so the error surfaces where eager PyTorch would
    raise instead of as wrong numbers. A ``RuntimeError`` like eager's.
    """


class DeviceIndexError(DeviceCheckError, IndexError):
    """An index computed or read on the device was out of range (eager raises IndexError here)."""


class BucketingError(NeuronCompileError, ValueError):
    """A shape-bucketing wrapper refused an input or output it cannot pad or slice safely."""
