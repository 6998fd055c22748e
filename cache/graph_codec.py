"""A safe, self-contained serialization of one ATen graph: what lets an entry be recompiled.

Owns ``graph.json``, stored in every backend entry next to its kernels, and the two functions
:func:`encode_graph` / :func:`decode_graph`. The format is plain JSON (no pickle: an entry from an
archive or a remote cache is untrusted data, and decoding it must never run code):

- ``nodes``: one record per FX node in order: ``name``, ``op``, ``target`` (a qualified ATen/prims
  op name such as ``aten::add.Tensor``, or one of a few Python operators), ``args``/``kwargs``
  (tagged JSON values, nodes referenced by name) and ``val`` (the tensor metadata: shape, stride,
  dtype, storage offset, or a tuple of them, or a scalar);
- ``constants``: tensors behind ``get_attr`` nodes, by value (dtype, shape, stride, hex bytes), and
  the values of lifted constants (placeholders marked ``neuron_constant``) in their node record;
- ``inputs``: the example inputs' metadata (tensors are rebuilt as FakeTensors, never allocated).

:func:`decode_graph` resolves targets only among ``torch.ops`` overloads and the allowlisted
operators below, so a hostile ``graph.json`` can at worst describe a different graph, which then
fails the key check (its digest is re-derived from the decoded graph). :func:`encode_graph` refuses
(:class:`GraphCodecError`) anything it cannot spell exactly, and the backend checks the round trip
(the decoded graph must have the same canonical text), so a stored graph always recompiles to the
same key.
"""

from __future__ import annotations

import json
import keyword
import logging
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from neuron_compile.errors import SOURCE_LINE_META, UNKNOWN_SOURCE_LINE, source_line

if TYPE_CHECKING:
    import torch
    import torch.fx

log = logging.getLogger(__name__)

GRAPH_FILE = "graph.json"
FORMAT = 1

_OPERATORS: dict[str, Any] = {f"_operator.{name}": getattr(operator, name) for name in (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow", "eq", "ne", "lt", "le", "gt", "ge")}
_MAX_CONSTANT_BYTES = 64 << 20


class GraphCodecError(Exception):
    """The graph can't be spelled (encode) or the stored text is not a valid graph (decode)."""


# --------------------------------------------------------------------------------------------
# Encoding


def _target_of(target: object) -> str:
    import torch

    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target._schema.name}.{target._overloadname}"
    for name, fn in _OPERATORS.items():
        if target is fn:
            return name
    raise GraphCodecError(f"target {target!r} is not an ATen op or an allowlisted operator")


def _value(v: object, names: dict[Any, str]) -> object:
    import torch
    import torch.fx

    if isinstance(v, torch.fx.Node):
        return {"node": names[v]}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, (list, tuple)):
        return {"list" if isinstance(v, list) else "tuple": [_value(x, names) for x in v]}
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise GraphCodecError("dict arguments must have string keys")
        return {"dict": {k: _value(x, names) for k, x in v.items()}}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    raise GraphCodecError(f"argument of type {type(v).__name__} cannot be stored")


def _meta(v: object) -> object:
    import torch

    if isinstance(v, torch.Tensor):
        if any(not isinstance(d, int) for d in (*v.shape, *v.stride())):
            raise GraphCodecError("symbolic shapes cannot be stored")
        return {"tensor": {"shape": list(v.shape), "stride": list(v.stride()), "offset": int(v.storage_offset()),
                           "dtype": str(v.dtype).removeprefix("torch."), "device": v.device.type,
                           "requires_grad": bool(v.requires_grad)}}
    if isinstance(v, (list, tuple)):
        return {"list" if isinstance(v, list) else "tuple": [_meta(x) for x in v]}
    if v is None or isinstance(v, (bool, int, str)):
        return {"value": v}
    if isinstance(v, float):
        return {"value": v if math.isfinite(v) else repr(v), "float": True}
    raise GraphCodecError(f"node value of type {type(v).__name__} cannot be stored")


def _constant(t: torch.Tensor) -> dict[str, object]:
    import torch
    from neuron_compile.cache.key import real_tensor
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        t = real_tensor(t)
        if t.is_meta or type(t).__name__ == "FakeTensor":
            raise GraphCodecError("a graph constant has no data (FakeTensor)")
        t = t.detach().to("cpu")
        dense = t.contiguous()
        raw = dense.reshape(-1).view(torch.uint8) if dense.numel() and dense.element_size() else dense
        data = raw.numpy().tobytes() if dense.numel() else b""
    if len(data) > _MAX_CONSTANT_BYTES:
        raise GraphCodecError(f"a graph constant is {len(data)} bytes (limit {_MAX_CONSTANT_BYTES})")
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "stride": list(t.stride()),
            "contiguous_stride": list(dense.stride()), "requires_grad": bool(t.requires_grad), "hex": data.hex()}


def encode_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> bytes:
    """``graph.json`` for ``gm`` compiled with ``example_inputs``; raises :class:`GraphCodecError`."""
    import torch
    from neuron_compile.cache.key import _resolve_attr

    names: dict[Any, str] = {}
    nodes: list[dict[str, object]] = []
    constants: dict[str, object] = {}
    for node in gm.graph.nodes:
        names[node] = node.name
        rec: dict[str, object] = {"name": node.name, "op": node.op}
        if node.op == "call_function":
            rec["target"] = _target_of(node.target)
        elif node.op == "get_attr":
            value = _resolve_attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise GraphCodecError(f"get_attr {node.target} is a {type(value).__name__}, not a tensor")
            rec["target"] = node.target
            constants[node.target] = _constant(value)
        elif node.op not in ("placeholder", "output"):
            raise GraphCodecError(f"{node.op} nodes cannot be stored")
        else:
            rec["target"] = node.target
            if node.op == "placeholder" and node.meta.get("neuron_constant"):  # a lifted tensor constant
                rec["constant"] = _constant(node.meta["val"])
        if node.op == "call_function":  # where the user sees it in error and check messages (rebuilt alike)
            where = source_line(node)
            if where != UNKNOWN_SOURCE_LINE:
                rec["where"] = where
        rec["args"] = _value(tuple(node.args), names)
        rec["kwargs"] = _value(dict(node.kwargs), names)
        if "val" in node.meta and "constant" not in rec:
            rec["val"] = _meta(node.meta["val"])
        nodes.append(rec)
    inputs = [_meta(x) for x in example_inputs]
    doc = {"format": FORMAT, "nodes": nodes, "constants": constants, "inputs": inputs}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


# --------------------------------------------------------------------------------------------
# Decoding


def _dtype(name: object) -> torch.dtype:
    import torch

    dt = getattr(torch, str(name), None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise GraphCodecError(f"unknown dtype {name!r}")
    return dt


def _resolve_target(spec: object) -> Any:
    import torch

    if not isinstance(spec, str):
        raise GraphCodecError(f"bad target {spec!r}")
    if spec in _OPERATORS:
        return _OPERATORS[spec]
    if not spec.startswith("op:"):
        raise GraphCodecError(f"target {spec!r} is not an ATen op or an allowlisted operator")
    qual, _, overload = spec[3:].rpartition(".")
    ns, _, name = qual.partition("::")
    if not (ns.isidentifier() and name.isidentifier() and (overload.isidentifier() or overload == "")):
        raise GraphCodecError(f"bad op name {spec!r}")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise GraphCodecError(f"op {spec[3:]} does not exist in this torch") from None


def _is_name(text: object) -> bool:
    """FX generates Python source from node names and targets: only plain identifiers are accepted."""
    return isinstance(text, str) and text.isidentifier() and text.isascii() and not keyword.iskeyword(text) \
        and not text.startswith("__")


def _decode_value(v: object, env: dict[str, Any]) -> object:
    import torch

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if not isinstance(v, dict) or len(v) != 1:
        raise GraphCodecError(f"bad argument {str(v)[:80]!r}")
    (tag, x), = v.items()
    if tag == "node":
        if x not in env:
            raise GraphCodecError(f"argument refers to unknown node {x!r}")
        return env[x]
    if tag == "float":
        return float(x)
    if tag in ("list", "tuple"):
        if not isinstance(x, list):
            raise GraphCodecError(f"bad {tag}")
        items = [_decode_value(i, env) for i in x]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        if not isinstance(x, dict):
            raise GraphCodecError("bad dict")
        return {str(k): _decode_value(i, env) for k, i in x.items()}
    if tag == "dtype":
        return _dtype(x)
    if tag == "device":
        try:
            return torch.device(str(x))
        except RuntimeError:
            raise GraphCodecError(f"bad device {x!r}") from None
    if tag in ("layout", "memory_format"):
        value = getattr(torch, str(x), None) if str(x).isidentifier() else None
        if not isinstance(value, torch.layout if tag == "layout" else torch.memory_format):
            raise GraphCodecError(f"bad {tag} {x!r}")
        return value
    raise GraphCodecError(f"unknown argument tag {tag!r}")


def _ints(x: object, what: str) -> list[int]:
    if not isinstance(x, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 40
                                          for i in x):
        raise GraphCodecError(f"bad {what} {str(x)[:60]!r}")
    return x


def _decode_meta(m: object, fake_mode: Any) -> object:
    import torch

    if not isinstance(m, dict) or len(m) not in (1, 2):
        raise GraphCodecError(f"bad node value {str(m)[:80]!r}")
    if "value" in m:
        value = m["value"]
        return float(value) if m.get("float") else value
    (tag, x), = m.items()
    if tag in ("list", "tuple"):
        items = [_decode_meta(i, fake_mode) for i in x] if isinstance(x, list) else None
        if items is None:
            raise GraphCodecError(f"bad {tag} value")
        return items if tag == "list" else tuple(items)
    if tag != "tensor" or not isinstance(x, dict):
        raise GraphCodecError(f"unknown node value tag {tag!r}")
    shape, stride = _ints(x.get("shape"), "shape"), _ints(x.get("stride"), "stride")
    offset = x.get("offset", 0)
    if len(shape) != len(stride) or not isinstance(offset, int) or offset < 0 or x.get("device") != "cpu":
        raise GraphCodecError("bad tensor metadata")
    with fake_mode:
        t = torch.empty_strided(shape, stride, dtype=_dtype(x.get("dtype")), device="cpu")
        if offset:
            t = t.as_strided(shape, stride, offset)
        if x.get("requires_grad") is True and t.dtype.is_floating_point:
            t.requires_grad_(True)
    return t


def _decode_constant(c: object) -> torch.Tensor:
    import torch

    if not isinstance(c, dict) or not isinstance(c.get("hex"), str):
        raise GraphCodecError("bad constant")
    dtype = _dtype(c.get("dtype"))
    shape, stride = _ints(c.get("shape"), "shape"), _ints(c.get("stride"), "stride")
    try:
        data = bytes.fromhex(c["hex"])
    except ValueError:
        raise GraphCodecError("constant bytes are not hex") from None
    numel = math.prod(shape)
    if len(data) != numel * torch.empty((), dtype=dtype).element_size():
        raise GraphCodecError("constant size does not match its shape")
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype) if data else torch.empty(0, dtype=dtype)
    dense = flat.reshape(shape)
    if list(dense.stride()) != stride and numel:
        dense = torch.empty_strided(shape, stride, dtype=dtype).copy_(dense)
    return dense.requires_grad_(bool(c.get("requires_grad")) and dtype.is_floating_point)


def decode_graph(blob: bytes) -> tuple[torch.fx.GraphModule, list[object]]:
    """Rebuild ``(gm, example_inputs)`` from ``graph.json``: node values and inputs are FakeTensors,
    constants real tensors. Raises :class:`GraphCodecError` on anything malformed."""
    import torch
    import torch.fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        raise GraphCodecError("graph.json is not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("nodes"), list):
        raise GraphCodecError(f"graph.json is not format {FORMAT}")
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    root = torch.nn.Module()
    consts = doc.get("constants") or {}
    if not isinstance(consts, dict):
        raise GraphCodecError("bad constants")
    graph = torch.fx.Graph()
    env: dict[str, Any] = {}
    for rec in doc["nodes"]:
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
            raise GraphCodecError("bad node record")
        op, name = rec.get("op"), rec["name"]
        if not _is_name(name) or name in env:
            raise GraphCodecError(f"bad or duplicate node name {name[:40]!r}")
        args = _decode_value(rec.get("args", {"tuple": []}), env)
        kwargs = _decode_value(rec.get("kwargs", {"dict": {}}), env)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise GraphCodecError(f"node {name}: bad args")
        if op == "placeholder":
            target = rec.get("target", name)
            if not isinstance(target, str) or not _is_name(target):
                raise GraphCodecError(f"node {name}: bad placeholder name {str(target)[:40]!r}")
            node = graph.create_node("placeholder", target, name=name)
        elif op == "get_attr":
            target = rec.get("target")
            if not isinstance(target, str) or target not in consts or not all(_is_name(p) for p in target.split(".")):
                raise GraphCodecError(f"node {name}: unknown constant {target!r}")
            owner = root
            *path, leaf = target.split(".")
            for atom in path:
                if not hasattr(owner, atom):
                    owner.add_module(atom, torch.nn.Module())
                owner = getattr(owner, atom)
            owner.register_buffer(leaf, _decode_constant(consts[target]))
            node = graph.create_node("get_attr", target, name=name)
        elif op == "call_function":
            node = graph.create_node("call_function", _resolve_target(rec.get("target")), args, kwargs, name=name)
        elif op == "output":
            node = graph.output(args[0] if len(args) == 1 else args)
        else:
            raise GraphCodecError(f"node {name}: op {op!r} is not allowed")
        if isinstance(rec.get("where"), str):
            node.meta[SOURCE_LINE_META] = rec["where"]
        if op == "placeholder" and "constant" in rec:
            node.meta["val"] = _decode_constant(rec["constant"])
            node.meta["neuron_constant"] = True
        elif "val" in rec:
            node.meta["val"] = _decode_meta(rec["val"], fake_mode)
        env[name] = node
    try:
        graph.lint()
        gm = torch.fx.GraphModule(root, graph)
    except Exception as exc:
        raise GraphCodecError(f"the stored graph is invalid: {exc}") from None
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise GraphCodecError("bad inputs")
    inputs = [_decode_meta(x, fake_mode) for x in raw_inputs]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders[: len(inputs)]):
        if node.meta.get("neuron_constant"):
            inputs[i] = node.meta["val"]  # lifted constants are passed as real tensors
    return gm, inputs
