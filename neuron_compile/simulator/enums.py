"""The ``nisa`` enums (engine, reduce_cmd, dge_mode, oob_mode, matmul_perf_mode, nc_version, dma_engine).

Values follow REFERENCE 3.6. Instructions accept only the enum members: raw ints (``dge_mode=2``)
were rejected by NKI 0.3.0 and raise :class:`RemovedAPIError` naming the member to use.
"""

from __future__ import annotations

import enum
import logging

from neuron_compile.errors import RemovedAPIError

log = logging.getLogger(__name__)


class engine(enum.IntEnum):  # noqa: N801 - NKI spelling
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.IntEnum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(str, enum.Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.IntEnum):  # noqa: N801
    dma = 1
    gpsimd_dma = 2


def check_enum(value: object, cls: type[enum.Enum], api: str, param: str) -> enum.Enum:
    """``value`` if it is a member of ``cls``; raw ints/strings raise RemovedAPIError naming the member."""
    if isinstance(value, cls):
        return value
    members = ", ".join(f"nisa.{cls.__name__}.{m}" for m in cls.__members__)
    try:
        hint = f"nisa.{cls.__name__}.{cls(value).name}"  # type: ignore[call-arg]
    except (ValueError, TypeError):
        hint = members
    raise RemovedAPIError(f"{api}: {param}={value!r}: raw values for enums were rejected in NKI 0.3.0; use {hint}")


ENGINE_NAMES = {e: e.name for e in engine}
