"""The IR's building blocks: affine HBM accesses, tile ops, kernel arguments (re-exported by ``ir``)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

# Values attached to ops are JSON scalars, tuples of them, or value names.
Attr = tuple[str, Any]


@dataclass(frozen=True)
class Access:
    """Affine addressing of a flat HBM argument: ``arg[offset + sum(strides[d] * idx[d])]`` over the space."""

    arg: int
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class TileOp:
    """One SSA op of a tile program. ``kind`` is 'full' or 'row'; ``args`` are value names or literals."""

    out: str
    opcode: str
    kind: str
    dtype: str
    args: tuple[Any, ...] = ()
    attrs: tuple[Attr, ...] = ()
    phase: int = 0

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    def __str__(self) -> str:
        args = ", ".join(str(a) for a in self.args)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs)
        return f"  [{self.phase}] {self.out}: {self.kind}<{self.dtype}> = {self.opcode}({args}{attrs})"


@dataclass(frozen=True)
class ArgSpec:
    """A flat HBM kernel argument or result: element count and NKI dtype name."""

    numel: int
    dtype: str


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return repr(obj)
    return obj


@functools.cache
def _field_names(tp: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(tp))


def plain(obj: Any) -> Any:
    """``dataclasses.asdict`` for JSON: dataclasses as dicts, tuples and lists as lists, no deep copies (IR values
    are immutable; ``asdict``'s copying was most of writing a plan: ~0.6 ms per kernel)."""
    if isinstance(obj, (tuple, list)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj):
        return {name: plain(getattr(obj, name)) for name in _field_names(type(obj))}
    return obj
