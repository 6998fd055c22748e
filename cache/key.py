"""Cache keys: what makes two compiles interchangeable.

Owns :class:`CacheKey` and :func:`compute_key`. A key is the sha256 of the canonical JSON of its
*parts* (:func:`digest_of`), so anyone holding the parts (a manifest, an imported archive) can
re-derive and check the digest. The parts are: the schema version; the package version plus a
fingerprint of the package's own ``*.py`` sources and ``*.j2`` templates; the torch, nki and
neuronx-cc versions; the target and every codegen knob; the canonical ATen graph (node names
normalized, constants hashed by value); the input signature; the graph kind; the caller's ``extra``.

Never part of a key: the cache path, HOME, hostname, process id, device index, or the values of
graph inputs. torch is imported lazily so the CLI can use :func:`digest_of` without paying for it.

Test hook: :func:`fingerprint_roots` lists what the source fingerprint hashes; tests monkeypatch it
(e.g. to point at a temp copy with an edited template) and call :func:`reset_source_fingerprint`.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import neuron_compile
from neuron_compile.config import codegen_snapshot, config

if TYPE_CHECKING:
    import torch
    import torch.fx

log = logging.getLogger(__name__)

SCHEMA_VERSION: int = 2
KINDS = ("forward", "backward", "inference", "dynamo-inference", "dynamo-train", "dynamo-frame")

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class CacheKey:
    """A cache key: ``digest`` (64 hex digits) = sha256 of the canonical JSON of ``parts``.

    ``graph_text`` is the canonical graph the digest covers (through its sha256 in ``parts``); it
    is recorded in the manifest so ``neuron-compile cache diff`` can show *how* two graphs differ.
    """

    digest: str
    parts: dict[str, object]
    graph_text: str = ""

    def __post_init__(self) -> None:
        if len(self.digest) != 64 or any(c not in "0123456789abcdef" for c in self.digest):
            raise ValueError(f"CacheKey.digest must be 64 lowercase hex digits, got {self.digest!r}")

    @property
    def short(self) -> str:
        return self.digest[:12]


def canonical_json(obj: object) -> str:
    """The one JSON spelling used for hashing: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def digest_of(parts: Mapping[str, object]) -> str:
    """sha256 hex of the canonical JSON of ``parts`` (how every key digest is derived)."""
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Versions and the package's own fingerprint


def _dist_version(name: str) -> str | None:
    """Installed distribution version, read from metadata only: PyPI's nki/neuronx-cc placeholders raise on import."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def fingerprint_roots() -> list[tuple[str, Path, str]]:
    """``(label, folder, glob)`` triples hashed into the source fingerprint.

    Labels, not absolute paths, enter the hash, so two checkouts at different paths agree.
    """
    roots: list[tuple[str, Path, str]] = []
    for module in ("neuron_compile", "neuron_compile.lowering", "neuron_compile.codegen", "neuron_compile.cache"):
        folder = _package_dir(module)
        if folder is not None:
            roots.append((module, folder, "*.py"))
    codegen = _package_dir("neuron_compile.codegen")
    if codegen is not None:
        roots.append(("neuron_compile.codegen:templates", codegen / "templates", "*.j2"))
    return roots


def _hash_tree(roots: Iterable[tuple[str, Path, str]]) -> str:
    h = hashlib.sha256()
    seen: set[tuple[str, str]] = set()
    for label, folder, pattern in roots:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob(pattern)):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            rel = (label, path.relative_to(folder).as_posix())
            if rel in seen:
                continue
            seen.add(rel)
            data = path.read_bytes()
            h.update(f"{rel[0]}/{rel[1]}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over the package's ``*.py`` sources and ``*.j2`` templates; computed once per process."""
    return _hash_tree(fingerprint_roots())


def reset_source_fingerprint() -> None:
    """Forget the memoized fingerprint (test hook, after monkeypatching :func:`fingerprint_roots`)."""
    source_fingerprint.cache_clear()


# --------------------------------------------------------------------------------------------
# Canonical graph


def real_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor (a Parameter unwrapped), safe to read inside a FakeTensorMode."""
    import torch

    return t.data if isinstance(t, torch.nn.Parameter) else t


def _tensor_digest(t: torch.Tensor) -> str:
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from neuron_compile.host_memory import host_bytes

    # Backend compilers run inside AOTAutograd's FakeTensorMode, where touching a real tensor (a
    # graph constant such as `x * torch.tensor(2.0)`) raises; hashing its bytes needs the mode off.
    with unset_fake_temporarily(), torch.no_grad():
        t = real_tensor(t).detach()
        if t.is_meta or type(t).__name__ == "FakeTensor":
            return "unmaterialized"
        t = t.to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.numel() and t.element_size() else t  # 0-d tensors too
        h = hashlib.sha256()
        h.update(f"{t.dtype}|{list(t.shape)}|".encode())
        h.update(host_bytes(raw) if t.numel() else b"")  # not .numpy(): it pins the storage's size
        return h.hexdigest()


def _dim(d: object) -> object:
    return d if isinstance(d, int) else str(d)


def _tensor_meta(t: Any) -> dict[str, object]:
    out: dict[str, object] = {"shape": [_dim(d) for d in t.shape], "dtype": str(t.dtype).replace("torch.", "")}
    try:
        out["stride"] = [_dim(s) for s in t.stride()]
    except (RuntimeError, TypeError):  # sparse / nested tensors have no strides
        out["stride"] = None
    return out


def _canon(value: object, names: Mapping[object, str]) -> object:
    """A JSON-able, address-free spelling of an FX argument (``names`` maps Nodes to normalized names)."""
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return "%" + names[value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)} if not math.isfinite(value) else value
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_canon(v, names) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[str(k), _canon(v, names)] for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]}
    if isinstance(value, torch.device):
        return {"device": value.type}  # never the index
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return {type(value).__name__: str(value)}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"sym": str(value)}
    if isinstance(value, torch.Tensor):
        return {"tensor": _tensor_digest(value), **_tensor_meta(value)}
    if isinstance(value, slice):
        return {"slice": [_canon(value.start, names), _canon(value.stop, names), _canon(value.step, names)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return {"op": _target_name(value)}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__qualname__}.{value.name}"}
    if callable(value):
        return {"callable": _target_name(value)}
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}", "repr": _ADDRESS.sub("", repr(value))}


def _target_name(target: object) -> str:
    import torch

    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.add.Tensor"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)
    try:
        from torch.fx.node import _get_qualified_name

        return _get_qualified_name(target)  # type: ignore[arg-type]
    except Exception:
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
        return f"{module}.{name}" if module else str(name)


def _meta_val(meta: Mapping[str, Any]) -> object:
    import torch

    val = meta.get("val", meta.get("example_value"))
    if val is None and "tensor_meta" in meta:
        val = meta["tensor_meta"]

    def one(v: object) -> object:
        if isinstance(v, torch.Tensor) or (hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "stride")):
            if isinstance(getattr(v, "stride", None), tuple):  # TensorMetadata: stride is a tuple field
                return {"shape": [_dim(d) for d in v.shape], "dtype": str(v.dtype).replace("torch.", ""),  # type: ignore[attr-defined]
                        "stride": [_dim(s) for s in v.stride]}  # type: ignore[attr-defined]
            return _tensor_meta(v)
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return {"sym": str(v)}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v if not (isinstance(v, float) and not math.isfinite(v)) else repr(v)
        return type(v).__name__

    return one(val)


def _resolve_attr(gm: torch.nn.Module, target: str) -> object:
    obj: object = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _module_fingerprint(mod: torch.nn.Module) -> dict[str, object]:
    import torch.fx

    if isinstance(mod, torch.fx.GraphModule):
        return {"graph": hashlib.sha256(canonical_graph(mod).encode()).hexdigest()}
    state = {name: _tensor_digest(t) for name, t in sorted(mod.state_dict().items())}
    return {"module": f"{type(mod).__module__}.{type(mod).__qualname__}",
            "config": _ADDRESS.sub("", mod.extra_repr()), "state": state}


def canonical_graph(gm: torch.fx.GraphModule) -> str:
    """Deterministic text of an FX graph, one node per line.

    Nodes are renamed by position (``arg0``.. for placeholders, ``n0``.. for the rest), targets are
    qualified op names, ``meta['val']`` shapes/dtypes/strides are included and tensor constants
    (``get_attr``) are hashed by value. No ids, addresses, user names or source lines.
    """
    import torch

    names: dict[object, str] = {}
    lines: list[str] = []
    n_args = n_ops = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"arg{n_args}"
            n_args += 1
        else:
            names[node] = f"n{n_ops}"
            n_ops += 1
        record: dict[str, object] = {"op": node.op}
        if node.op == "placeholder" and node.meta.get("neuron_constant"):  # a lifted tensor constant
            record["const"] = {"tensor": _tensor_digest(node.meta["val"]), **_tensor_meta(node.meta["val"])}
        if node.op == "get_attr":
            value = _resolve_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                record["const"] = {"tensor": _tensor_digest(value), **_tensor_meta(value)}
            elif isinstance(value, torch.nn.Module):
                record["const"] = _module_fingerprint(value)
            else:
                record["const"] = _canon(value, names)
        elif node.op == "call_module":
            record["target"] = _module_fingerprint(_resolve_attr(gm, node.target))  # type: ignore[arg-type]
        elif node.op not in ("placeholder", "output"):
            record["target"] = _target_name(node.target)
        record["args"] = _canon(tuple(node.args), names)
        if node.kwargs:
            record["kwargs"] = _canon(dict(node.kwargs), names)
        if node.op != "output":
            record["val"] = _meta_val(node.meta)
        lines.append(f"{names[node]} = {canonical_json(record)}")
    return "\n".join(lines) + "\n"


def graph_summary(gm: torch.fx.GraphModule) -> dict[str, object]:
    """Short readable summary of a graph: node count and op counts by qualified name."""
    ops = Counter(_target_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
    return {"nodes": len(gm.graph.nodes), "ops": dict(sorted(ops.items()))}


# --------------------------------------------------------------------------------------------
# Inputs, extras, the key


def input_signature(example_inputs: Sequence[object]) -> list[dict[str, object]]:
    """One dict per input: tensors give shape, dtype, stride, requires_grad, device type; scalars their value."""
    import torch

    sig: list[dict[str, object]] = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            sig.append({"kind": "tensor", **_tensor_meta(x), "requires_grad": bool(x.requires_grad),
                        "device": x.device.type})
        elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            sig.append({"kind": "sym", "expr": str(x)})
        elif x is None or isinstance(x, (bool, int, str)):
            sig.append({"kind": type(x).__name__, "value": x})
        elif isinstance(x, float):
            sig.append({"kind": "float", "value": x if math.isfinite(x) else repr(x)})
        else:
            sig.append({"kind": f"{type(x).__module__}.{type(x).__qualname__}"})
    return sig


def _graph_input_signature(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> list[dict[str, object]]:
    """:func:`input_signature`, except that an int feeding a symbolic-size placeholder (automatic
    dynamic shapes) is keyed by its symbol, not by the value this call happened to see."""
    import torch

    sig = input_signature(example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders[: len(sig)]):
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.SymInt) and sig[i].get("kind") == "int":
            sig[i] = {"kind": "sym", "expr": str(val)}
    return sig


def _jsonable(value: object, where: str) -> object:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    text = str(value)
    if type(value).__module__ == "torch" and not _ADDRESS.search(text):  # torch.dtype, torch.Size, ...
        return text
    raise TypeError(f"cache key part {where}={value!r}: not JSON-able; pass str/int/float/bool/None/list/dict")


def compute_key(gm: torch.fx.GraphModule, example_inputs: Sequence[object], *, kind: str,
                extra: Mapping[str, object] | None = None) -> CacheKey:
    """The cache key of compiling ``gm`` for ``example_inputs`` as a ``kind`` graph."""
    if kind not in KINDS:
        raise ValueError(f"compute_key: kind={kind!r}, expected one of {', '.join(KINDS)}")
    text = canonical_graph(gm)
    parts: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "neuron_compile": {"version": neuron_compile.__version__, "source_sha256": source_fingerprint()},
        "torch": _torch_version(),
        "nki": _dist_version("nki"),
        "neuronx_cc": _dist_version("neuronx-cc"),
        "target": config.target,
        "codegen": _jsonable(codegen_snapshot(), "codegen"),
        "graph": {"sha256": hashlib.sha256(text.encode()).hexdigest(), **graph_summary(gm)},
        "inputs": _graph_input_signature(gm, example_inputs),
        "extra": _jsonable(dict(extra or {}), "extra"),
    }
    return CacheKey(digest=digest_of(parts), parts=parts, graph_text=text)


def flatten_parts(parts: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """``{"codegen.fuse": True, "inputs[0].shape": [2, 3], ...}``: the leaves ``diff`` compares."""
    out: dict[str, object] = {}
    for name, value in parts.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping) and value and name != "ops":
            out.update(flatten_parts(value, path))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for i, v in enumerate(value):
                out.update(flatten_parts(v, f"{path}[{i}]"))  # type: ignore[arg-type]
        else:
            out[path] = value
    return out
