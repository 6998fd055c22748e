"""What collectives cost on Trainium, and how much of it compute hides.

Input: a :class:`~neuron_compile.lowering.ops.collectives.CollectiveSpec` (what moves, over how many
ranks) and a target; output: a :class:`CommEstimate` (algorithm, bytes each rank sends, hops, latency
and transfer time). :func:`simulate_overlap` replays a step list (compute, collective issue, wait) the
way :mod:`neuron_compile.collective_runner` runs it and the collective engines execute it: compute runs
on the NeuronCore in order; collectives run one after another on the chip's collective engines (CC-cores)
while compute continues, and a ``wait`` blocks compute until its collective finished. The result says
how much communication is exposed (not hidden behind compute). :func:`graph_overlap` does this for a
compiled graph with collectives, with each compute segment's time from :mod:`neuron_compile.costmodel`.

The interconnect numbers (:data:`neuron_compile.costmodel.INTERCONNECT`) and the algorithm rules come
from AWS's Neuron documents, listed in ``docs/cost_model.md`` ("Collectives"):

- time = hops x per-hop latency + bytes each rank sends / the rank's share of link bandwidth;
- algorithm by message size, as the Neuron runtime picks it within a node: Mesh below 1 MB (2 steps
  per phase, 1 within a chip), Recursive Doubling-Halving from 1 MB to 56 MB (log2 N steps per phase), ring-class above
  (N - 1 steps per phase); all-reduce is a reduce-scatter followed by an all-gather (two phases);
- every algorithm is bandwidth-optimal: a rank sends (N - 1) chunks per phase. Mesh's link
  over-subscription has no published factor and is not modelled (an optimistic departure for
  small messages, where latency dominates anyway);
- a group larger than one instance crosses EFA: the hop latency and bandwidth of the node-to-node
  network apply to the whole collective (conservative: no hierarchical split).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_compile.costmodel import INTERCONNECT, Interconnect

log = logging.getLogger(__name__)

MESH_MAX_BYTES = 1 << 20  # below 1 MB: Mesh (intra-node collectives guide, "Algorithm Summary")
RDH_MAX_BYTES = 56 << 20  # 1-56 MB: Recursive Doubling-Halving; above: ring-class (KangaRing / Ring)


def interconnect(target: str) -> Interconnect:
    try:
        return INTERCONNECT[target]
    except KeyError:
        raise ValueError(f"communication cost: no documented interconnect figures for target {target!r} "
                         f"(known: {', '.join(sorted(INTERCONNECT))})") from None


@dataclass(frozen=True)
class CommEstimate:
    """One collective on one target: per-rank traffic, algorithm, and time (us)."""

    op: str
    group_size: int
    buffer_bytes: int  # the per-rank buffer the algorithm is chosen by (the larger of input and output)
    wire_bytes: int  # bytes each rank sends
    algorithm: str
    hops: int
    latency_us: float
    transfer_us: float
    link_gbps: float  # this rank's share of the link bandwidth
    fabric: str  # "neuronlink" within an instance, "efa" across instances

    @property
    def time_us(self) -> float:
        return self.latency_us + self.transfer_us

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "group_size": self.group_size, "buffer_bytes": self.buffer_bytes,
                "wire_bytes": self.wire_bytes, "algorithm": self.algorithm, "hops": self.hops,
                "latency_us": round(self.latency_us, 3), "transfer_us": round(self.transfer_us, 3),
                "time_us": round(self.time_us, 3), "link_gbps": self.link_gbps, "fabric": self.fabric}

    def describe(self) -> str:
        return (f"{self.op} over {self.group_size} ranks: {_bytes(self.wire_bytes)} sent per rank, "
                f"{self.algorithm} ({self.hops} hops), {self.fabric} at {self.link_gbps:g} GB/s per rank: "
                f"{self.time_us:.1f} us ({self.latency_us:.1f} latency + {self.transfer_us:.1f} transfer)")


def _bytes(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 100_000 else f"{n} B"


def _steps_per_phase(algorithm: str, n: int, chips: int) -> int:
    if n <= 1:
        return 0
    if algorithm == "mesh":
        return 2 if chips > 1 else 1  # a step between chips, then one within the chip
    if algorithm == "rdh":
        return max(1, math.ceil(math.log2(n)))
    return n - 1


def estimate_collective(op: str, group_size: int, in_bytes: int, out_bytes: int, target: str = "trn2",
                        ranks_per_chip: int | None = None) -> CommEstimate:
    """Cost of one collective. ``in_bytes``/``out_bytes``: one rank's input and output buffers.

    ``ranks_per_chip``: ranks of the group sharing a chip's links (default: the target's ranks per chip at
    LNC=2, capped by the group size)."""
    ic = interconnect(target)
    n = max(int(group_size), 1)
    buffer = max(in_bytes, out_bytes)
    per_chip = min(ranks_per_chip or ic.ranks_per_chip, n)
    if op == "all_gather":
        wire, phases = (n - 1) * in_bytes, 1
    elif op == "reduce_scatter":
        wire, phases = (n - 1) * out_bytes, 1
    elif op == "all_reduce":
        wire, phases = 2 * (n - 1) * math.ceil(in_bytes / n), 2
    elif op == "all_to_all":
        wire, phases = (n - 1) * math.ceil(in_bytes / n), 1
    elif op == "broadcast":
        wire, phases = in_bytes, 1  # pipelined down a ring: the root sends the buffer once
    else:
        raise ValueError(f"communication cost: unknown collective {op!r}")
    algorithm = "mesh" if buffer < MESH_MAX_BYTES else "rdh" if buffer <= RDH_MAX_BYTES else "ring"
    if n == 1:
        algorithm, wire = "none", 0
    chips = math.ceil(n / per_chip)
    if chips <= 1:  # the whole group on one chip: its DMA engines move the data through HBM (read + write)
        fabric, link, hop_us = "on-chip", ic.chip_hbm_gbps / 2 / per_chip, ic.hop_latency_us
    elif chips <= ic.chips_per_instance:
        fabric, link, hop_us = "neuronlink", ic.link_gbps_per_chip / per_chip, ic.hop_latency_us
    else:
        fabric, link, hop_us = "efa", ic.efa_gbps_per_chip / per_chip, ic.efa_hop_latency_us
    hops = phases * _steps_per_phase(algorithm, n, chips)
    transfer_us = wire / (link * 1e3)  # GB/s = 1e3 bytes/us
    return CommEstimate(op, n, buffer, wire, algorithm, hops, hops * hop_us, transfer_us, round(link, 3), fabric)


def estimate_spec(spec: Any, target: str = "trn2", ranks_per_chip: int | None = None) -> CommEstimate:
    """:func:`estimate_collective` for a lowered collective (a ``CollectiveSpec``)."""
    return estimate_collective(spec.op, spec.group_size, spec.in_bytes, spec.out_bytes, target, ranks_per_chip)


# ------------------------------------------------------------------------------------------- overlap

@dataclass
class Overlap:
    """A replayed step list: compute time, communication time, and what of it compute did not hide."""

    total_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    collectives: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hidden_fraction(self) -> float:
        return 1.0 - self.exposed_comm_us / self.comm_us if self.comm_us else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"total_us": round(self.total_us, 3), "compute_us": round(self.compute_us, 3),
                "comm_us": round(self.comm_us, 3), "exposed_comm_us": round(self.exposed_comm_us, 3),
                "hidden_fraction": round(self.hidden_fraction, 4), "collectives": self.collectives}

    def describe(self) -> str:
        return (f"compute {self.compute_us:.1f} us, communication {self.comm_us:.1f} us, of which "
                f"{self.exposed_comm_us:.1f} us exposed ({self.hidden_fraction:.0%} hidden behind compute); "
                f"step {self.total_us:.1f} us")


def simulate_overlap(steps: Sequence[tuple[str, Any, float]]) -> Overlap:
    """Replay ``(kind, name, us)`` steps: ``compute`` (us of NeuronCore time), ``issue`` (a collective taking
    us on the collective engines, which run one collective at a time), ``wait`` (block until the collective
    ``name`` finished; us ignored)."""
    t = 0.0  # the NeuronCore's clock
    link_free = 0.0  # when the collective engines finish what they were given
    done: dict[Any, float] = {}
    compute = comm = 0.0
    log_: list[dict[str, Any]] = []
    for kind, name, us in steps:
        if kind == "compute":
            t += us
            compute += us
        elif kind == "issue":
            start = max(t, link_free)
            link_free = start + us
            done[name] = link_free
            comm += us
            log_.append({"name": str(name), "issued_us": round(t, 3), "start_us": round(start, 3),
                         "end_us": round(link_free, 3)})
        elif kind == "wait":
            t = max(t, done.get(name, t))
        else:
            raise ValueError(f"simulate_overlap: unknown step kind {kind!r}")
    t = max(t, link_free)  # the graph returns once every collective finished
    return Overlap(t, compute, comm, t - compute, log_)


def graph_overlap(graph: Any, target: str = "trn2", ranks_per_chip: int | None = None) -> dict[str, Any]:
    """Collectives and estimated overlap of one compiled graph with collectives
    (a :class:`~neuron_compile.collective_runner.CollectiveGraph`)."""
    import operator

    from neuron_compile.compile_record import estimate_stats_us

    steps: list[tuple[str, Any, float]] = []
    estimates = []
    unknown = 0
    for step in graph.steps:
        if step.kind == "compute":
            us = 0.0
            for stats in step.stats:
                one = estimate_stats_us(stats)
                unknown += one is None
                us += one or 0.0
            steps.append(("compute", None, us))
        elif step.kind == "issue":
            est = estimate_spec(step.spec, target, ranks_per_chip)
            estimates.append({"node": step.nodes[0].name, **est.to_json(), "describe": est.describe()})
            steps.append(("issue", step.nodes[0], est.time_us))
        elif step.kind == "wait":
            src = step.nodes[0].args[0]
            producer = src.args[0] if getattr(src, "target", None) is operator.getitem else src
            steps.append(("wait", producer, 0.0))
    overlap = simulate_overlap(steps)
    return {"kind": graph.kind, "target": target, "collectives": estimates, "overlap": overlap.to_json(),
            "describe": overlap.describe(), "segments_without_estimate": unknown}
