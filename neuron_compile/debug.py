"""Debug dumps (``NEURON_COMPILE_DEBUG_DIR`` / ``config.debug_dir``): a tool above the compile pipeline.

:func:`dump_record` writes one folder per compiled graph,
``<debug_dir>/rank<R>_pid<P>/g<index>_<kind>/``, holding:

- ``dynamo_graph.py``: the FX graph Dynamo captured (when the graph came through the backend entry);
- ``aten_graph.py``: the ATen graph after AOTAutograd and our decompositions;
- ``kernel_ir.txt`` / ``kernel_ir.json``: the kernel IR (``str(plan)`` and ``plan.to_json()``);
- ``kernels/<name>.py``: every rendered NKI source;
- ``runner_plan.json``: the runner's plan (what the cache stores next to the sources);
- ``metrics.json``: the graph's compile metrics (and fallback records).

A graph split for eager fallback has one ``segment<i>/`` sub-folder per compiled segment. The rank
comes from ``RANK`` (torchrun) or is 0.

Importing this module registers :func:`dump_hook` with :mod:`neuron_compile.compile_record` (the package
does it when it registers the backend); the core never imports it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from torch import fx

from neuron_compile import compile_record
from neuron_compile.config import config

log = logging.getLogger(__name__)

def process_folder(root: str | os.PathLike[str]) -> Path:
    rank = os.environ.get("RANK", "0")
    return Path(root) / f"rank{rank}_pid{os.getpid()}"


def _graph_text(gm: fx.GraphModule) -> str:
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # print_readable needs codegen that can fail on exotic graphs
        return str(gm.graph)


def dump_record(rec: Any, gm: fx.GraphModule, runner: Any) -> Path:
    """Write the debug folder of one metrics record; returns its path."""
    folder = process_folder(config.debug_dir) / rec.name
    folder.mkdir(parents=True, exist_ok=True)
    if rec.dynamo_gm is not None:
        (folder / "dynamo_graph.py").write_text(_graph_text(rec.dynamo_gm))
    (folder / "aten_graph.py").write_text(_graph_text(gm))
    for i, unit in enumerate(rec.units):
        sub = folder if len(rec.units) == 1 and not rec.fallback_ops else folder / f"segment{i}"
        _dump_unit(sub, unit)
    (folder / "metrics.json").write_text(json.dumps(rec.to_json(), indent=1, sort_keys=True, default=str))
    log.info("neuron: debug dump of %s written to %s", rec.name, folder)
    return folder


def _dump_unit(folder: Path, unit: Any) -> None:
    from neuron_compile.backend import build_artifacts

    folder.mkdir(parents=True, exist_ok=True)
    plan = unit.stats.get("plan")
    files = unit.stats.get("files")
    if plan is None or not plan.kernels or files is None:
        # A cache hit carries no IR: lower again (deterministic) to show it.
        files, _summary, plan = build_artifacts(unit.gm, unit.example_inputs)
    if folder.name.startswith("segment"):
        (folder / "aten_graph.py").write_text(_graph_text(unit.gm))
    (folder / "kernel_ir.txt").write_text(str(plan) + "\n")
    (folder / "kernel_ir.json").write_text(json.dumps(plan.to_json(), indent=1, sort_keys=True, default=str))
    kernels = folder / "kernels"
    kernels.mkdir(exist_ok=True)
    for name, data in files.items():
        if name.startswith("kernels/"):
            (kernels / name.split("/", 1)[1]).write_bytes(data)
    if "plan.json" in files:
        runner = json.loads(files["plan.json"])  # the stored copy is compact; this one is for reading
        (folder / "runner_plan.json").write_text(json.dumps(runner, indent=1, sort_keys=True))


def dump_hook(rec: Any, gm: fx.GraphModule, runner: Any) -> Any:
    """Finish hook: the debug dump of a finished graph when ``config.debug_dir`` is set (never fails a compile)."""
    if config.debug_dir:
        try:
            rec.debug_dir = str(dump_record(rec, gm, runner))
        except OSError as exc:
            log.warning("neuron-compile: could not write the debug dump under %s: %s", config.debug_dir, exc)
    return runner


compile_record.add_finish_hook("debug_dump", dump_hook)
