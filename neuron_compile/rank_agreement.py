"""Every rank compiles a distributed graph, or every rank fails with the same error.

In a distributed job each rank compiles its own graphs. When one rank fails (an op it cannot lower,
a bad option, a lowering error) it raises, while the others carry on to the next collective, which
the failed rank never joins: they hang until the process group times out (30 minutes by default).
So for every graph that takes part in distributed training, the compile is wrapped in
:func:`agree`: each rank posts "ok" or its error to the job's rendezvous store (the ``TCPStore``
``torchrun`` set up; no collective on the user's process groups, whose order we must not disturb)
under a per-process sequence number, then waits for every rank's entry. If any rank failed, all ranks
raise the same :class:`~neuron_compile.errors.DistributedCompileError` naming the failing rank(s) and
their error; a rank that does not arrive within ``config.rank_agreement_timeout`` seconds is reported
the same way instead of hanging.

A graph is distributed (:func:`is_distributed_graph`) when ``torch.distributed`` runs with more than
one rank and the Dynamo graph calls collectives, takes DTensors, reads FSDP-managed parameters
(FSDP2's ``fully_shard``), or is compiled inside a ``DistributedDataParallel`` forward. Graphs a
single rank compiles on its own (say, evaluation on rank 0) are left alone: they never wait.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from torch import fx

from neuron_compile.config import config
from neuron_compile.errors import DistributedCompileError

log = logging.getLogger(__name__)

_SEQ = [0]
_LOCK = threading.Lock()
_PREFIX = "neuron_compile/compile"
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor", "c10d")


def _world() -> tuple[int, int] | None:
    """(rank, world size) of a running multi-rank job, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    return (dist.get_rank(), world) if world > 1 else None


def _source_chain(source: Any) -> Iterator[Any]:
    while source is not None:
        yield source
        source = getattr(source, "base", None)


def is_distributed_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Does this Dynamo graph take part in distributed training (see the module docstring)?"""
    if _world() is None:
        return False
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    if DistributedDataParallel._get_active_ddp_module() is not None:
        return True  # compiled inside a DDP forward: its gradient buckets are all-reduced across ranks
    if any(isinstance(x, DTensor) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value")
            if isinstance(val, DTensor):
                return True
            grapharg = node.meta.get("grapharg")
            if any(type(s).__name__ == "FSDPNNModuleSource" for s in _source_chain(getattr(grapharg, "source", None))):
                return True  # an FSDP2 (fully_shard) module's parameter
        elif node.op == "call_function":
            module = getattr(node.target, "__module__", "") or ""  # torch._ops.<namespace> for torch.ops
            if module.startswith("torch.distributed") or module.rsplit(".", 1)[-1] in _COLLECTIVE_NAMESPACES:
                return True
    return False


def _store() -> Any:
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


@contextlib.contextmanager
def agree(what: str) -> Iterator[None]:
    """Run the compile in the block on every rank; if any rank fails, every rank raises the same error.

    A no-op outside a multi-rank job. The failing rank's own exception is chained (``from``)."""
    world = _world()
    if world is None:
        yield
        return
    rank, size = world
    with _LOCK:
        seq = _SEQ[0]
        _SEQ[0] += 1
    key = f"{_PREFIX}/{seq}"
    error: BaseException | None = None
    try:
        yield
    except Exception as exc:
        error = exc
    store = _store()
    status = "ok" if error is None else f"{type(error).__name__}: {error}"
    store.set(f"{key}/{rank}", status)
    timeout = float(config.rank_agreement_timeout)
    try:
        store.wait([f"{key}/{r}" for r in range(size)], datetime.timedelta(seconds=timeout))
    except Exception as exc:  # a rank never got here: it crashed elsewhere, or compiles other graphs
        missing = [r for r in range(size) if not store.check([f"{key}/{r}"])]
        raise DistributedCompileError(
            f"neuron backend: {what} (distributed graph #{seq}): rank(s) {', '.join(map(str, missing))} of {size} "
            f"did not finish compiling it within {timeout:g} s (NEURON_COMPILE_RANK_AGREEMENT_TIMEOUT); a rank that "
            f"failed elsewhere, or ranks that compile different graphs, stop the job here instead of hanging on a "
            f"collective. This rank's own compile {'failed: ' + status if error else 'succeeded'}.") from (error or exc)
    failures = []
    for r in range(size):
        got = store.get(f"{key}/{r}").decode()
        if got != "ok":
            failures.append((r, got))
    if failures:
        first_rank, first = failures[0]
        others = f" (and on rank(s) {', '.join(str(r) for r, _ in failures[1:])})" if len(failures) > 1 else ""
        raise DistributedCompileError(
            f"neuron backend: compiling {what} (distributed graph #{seq}) failed on rank {first_rank} of "
            f"{size}{others}: {first}\nEvery rank stops with this error so that none waits forever on a "
            f"collective the failed rank would never join; fix the error above (it is the same on every rank "
            f"that runs this code).", [f"rank {r}: {m}" for r, m in failures]) from error
    log.debug("rank %d: %s (distributed graph #%d) compiled on all %d ranks", rank, what, seq, size)


def maybe_agree(distributed: bool, what: str) -> contextlib.AbstractContextManager[None]:
    return agree(what) if distributed else contextlib.nullcontext()

