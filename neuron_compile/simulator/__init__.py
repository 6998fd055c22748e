"""The bundled NKI CPU simulator (``nki``, ``nki.language`` as ``nl``, ``nki.isa`` as ``nisa``).

Run a kernel with ``simulate(kernel)(*arrays)`` (or call an ``@nki.jit`` kernel with NumPy / torch
arrays), load generated kernel source with :func:`load_kernel_source`, and record executed
instructions with :func:`trace`. See ``docs/simulator.md``.

Module map: ``dtypes`` (dtype constants, casts), ``tensor`` (storage + views), ``language`` and
``nl_ops`` (``nl``), ``isa_*`` (``nisa`` instructions by family; ``isa_control``: sequencer
registers), ``checks`` (constraint checks), ``ops`` (opcode tables), ``state`` (accumulator
registers, pools), ``targets``, ``trace``, ``kernel`` (jit / simulate), ``loader``, ``namespaces``
(the namespace objects and missing-name errors).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from neuron_compile.simulator import calls as _calls
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import enums as _enums
from neuron_compile.simulator import isa_control as _ctl
from neuron_compile.simulator import isa_elementwise as _ew
from neuron_compile.simulator import isa_matmul as _mm
from neuron_compile.simulator import isa_movement as _mv
from neuron_compile.simulator import isa_mx as _mx
from neuron_compile.simulator import isa_random as _rand
from neuron_compile.simulator import isa_reduce as _rd
from neuron_compile.simulator import isa_search as _search
from neuron_compile.simulator import isa_select as _sel
from neuron_compile.simulator import language as _lang
from neuron_compile.simulator import nl_ops as _nlops
from neuron_compile.simulator import ops as _ops
from neuron_compile.simulator.kernel import Kernel, jit, simulate
from neuron_compile.simulator.loader import load_kernel_source
from neuron_compile.simulator.namespaces import API, Namespace
from neuron_compile.simulator.targets import current_target, use_target
from neuron_compile.simulator.tensor import NkiTensor, ds
from neuron_compile.simulator.trace import InstructionRecord, Trace, trace

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------ nl
_nl_exports: dict[str, Any] = {name: getattr(_dt, name) for name in _dt.ALL_DTYPES}
_nl_exports["DType"] = str
for _name in ("sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "tile_size", "is_hbm", "is_on_chip", "is_psum",
              "is_sbuf", "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "rand", "random_seed",
              "shared_constant", "shared_identity_matrix", "program_id", "num_programs", "program_ndim",
              "no_reorder", "device_print", "fori_loop", "while_loop", "affine_range", "sequential_range",
              "static_range", "dynamic_range", "NKIObject", "MemoryRegion", "NkiTensor"):
    _nl_exports[_name] = getattr(_lang, _name)
_nl_exports.update({k: _calls.language(v, k) for k, v in _nlops.FUNCTIONS.items()})
_nl_exports["ds"] = ds
for _name in ("average", "prelu", "bypass"):
    _nl_exports[_name] = _ops.Opcode(_name)
_nl_removed = {
    "arange": "removed in NKI 0.2.0; use Python slices, nl.ds(start, size) or NkiTensor.ap()",
    "mgrid": "removed in NKI 0.2.0; use Python slices, nl.ds(start, size) or NkiTensor.ap()",
    "par_dim": "removed (block dimensions); put the partition dim first and use Python lists of tiles",
    "tensor": "moved to nki.meta.tensor in NKI 0.2.0",
}
nl = Namespace("nki.language", _nl_exports, removed=_nl_removed)

# ------------------------------------------------------------------------------------------ nisa
_nisa_exports: dict[str, Any] = {}
_ISA_FUNCS = {
    _mv: ("dma_copy", "dma_transpose", "dma_compute", "tensor_copy", "memset", "iota", "nc_stream_shuffle",
          "nc_n_gather"),
    _mm: ("nc_matmul", "nc_transpose"),
    _ew: ("tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "activation", "activation_reduce", "reciprocal",
          "exponential", "activate2"),
    _rd: ("tensor_reduce", "tensor_partition_reduce", "tensor_scalar_reduce", "tensor_scalar_cumulative",
          "tensor_tensor_scan", "bn_stats", "bn_aggr", "max8", "nc_find_index8"),
    _sel: ("affine_select", "select_reduce", "tensor_copy_predicated", "range_select"),
    _rand: ("rng", "dropout", "set_rng_seed", "rand_set_state", "rand_get_state", "rand2"),
    _search: ("topk", "local_gather", "sequence_bounds", "nonzero_with_count", "nc_match_replace8"),
    _mx: ("nc_matmul_mx", "quantize_mx"),
    _ctl: ("core_barrier", "sendrecv"),
}
for _mod, _names in _ISA_FUNCS.items():
    for _name in _names:
        _nisa_exports[_name] = _calls.isa(getattr(_mod, _name), _name)
for _name in ("VirtualRegister", "register_alloc", "register_move", "register_load", "register_store"):
    _nisa_exports[_name] = getattr(_ctl, _name)
_nisa_exports["NkiInstruction"] = _calls.NkiInstruction
_ENUMS = ("engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine")
for _name in _ENUMS:
    _nisa_exports[_name] = getattr(_enums, _name)
# nki.isa.constants re-exports the enums (AWS's NKI library imports them from there).
_nisa_exports["constants"] = Namespace("nki.isa.constants", {n: getattr(_enums, n) for n in _ENUMS})


def get_nc_version() -> _enums.nc_version:
    """The simulated NeuronCore generation (follows ``current_target()``)."""
    from neuron_compile.simulator import targets

    return _enums.nc_version(targets.nc_version())


def get_nc_sub_version() -> int:
    return 0


class NkiValidationError(Exception):
    """Raised by real NKI for violated hardware constraints (the simulator raises SimulatorConstraintError)."""


_nisa_exports.update(get_nc_version=get_nc_version, get_nc_sub_version=get_nc_sub_version,
                     NkiValidationError=NkiValidationError)
_nisa_deprecated = {
    f"{e}_engine": (getattr(_enums.engine, e), f"use nisa.engine.{e}")
    for e in ("tensor", "vector", "scalar", "gpsimd", "unknown")
}
_nisa_removed = {
    "tensor_copy_dynamic_src": "removed in NKI 0.4.0; use nisa.tensor_copy with src=t.ap(..., scalar_offset=...)",
    "tensor_copy_dynamic_dst": "removed in NKI 0.4.0; use nisa.tensor_copy with dst=t.ap(..., scalar_offset=...)",
}
nisa = Namespace("nki.isa", _nisa_exports, removed=_nisa_removed, deprecated=_nisa_deprecated)

# ------------------------------------------------------------------------------------------ nki
collectives = Namespace("nki.collectives", {})


class _TensorType:
    """``nki.typing.tensor[shape]``: a kernel parameter annotation (checked by nothing at run time)."""

    def __init__(self, shape: tuple[Any, ...] = ()) -> None:
        self.shape = shape

    def __class_getitem__(cls, shape: Any) -> _TensorType:
        return cls(shape if isinstance(shape, tuple) else (shape,))

    def __repr__(self) -> str:
        return f"nki.typing.tensor[{', '.join(map(str, self.shape))}]"


typing = Namespace("nki.typing", {"tensor": _TensorType})
nki = Namespace("nki", {"jit": jit, "simulate": simulate, "language": nl, "isa": nisa, "collectives": collectives,
                        "typing": typing, "dtype": str},
                removed={"tensor": "moved to nki.meta.tensor in NKI 0.2.0"})


def implemented_names() -> dict[str, list[str]]:
    """Module -> implemented public names (computed from the namespaces, checked against neuron_compile.nki_api)."""
    out = {ns.__name__: ns.implemented() for ns in (nki, nl, nisa)}
    out["nki.isa"] = sorted(set(out["nki.isa"]) | set(_nisa_deprecated))  # deprecated aliases still resolve
    members = API["members"].get("nki.language.NkiTensor", [])
    out["nki.language.NkiTensor"] = sorted(
        m for m in members if (m in NkiTensor.__dict__ and m != "indirect") or m in ("shape", "strides", "offset", "dtype", "name"))
    return out


warnings.filterwarnings("default", category=DeprecationWarning, module="neuron_compile.simulator")

__all__ = ["InstructionRecord", "Kernel", "NkiTensor", "Trace", "current_target", "implemented_names", "jit",
           "load_kernel_source", "nisa", "nki", "nl", "simulate", "trace", "use_target"]
