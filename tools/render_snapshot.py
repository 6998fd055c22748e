"""Write every kernel the code generator renders for a workload set, one file per kernel, for ``diff -r``.

    python tools/render_snapshot.py --out /tmp/before            # the codegen corpus (tests/codegen/corpus.py)
    python tools/render_snapshot.py --out /tmp/before --zoo      # and every model of tests/models/zoo.py

Run it on two revisions and compare the folders: a change of form in the code generator (a renderer moved
into a template) must leave them identical. Layout: ``<out>/<entry>/<kernel>.nki.py``; zoo entries are
``zoo-<model>-<mode>-<dtype>``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "codegen"), str(ROOT / "tests" / "models"), str(ROOT / "tests")]


def _write(out: Path, entry: str, sources: dict[str, str]) -> None:
    folder = out / entry
    folder.mkdir(parents=True, exist_ok=True)
    for kernel, src in sources.items():
        (folder / f"{kernel.replace(':', '.')}.nki.py").write_text(src)
    print(f"{entry}: {len(sources)} kernels", flush=True)


def _corpus(out: Path) -> None:
    from corpus import CORPUS, compile_entry

    for entry in CORPUS:
        _write(out, entry.name, compile_entry(entry).sources)


def _zoo(out: Path) -> None:
    import torch
    from zoo import ZOO, loss_of

    import neuron_compile.backend as backend
    from neuron_compile.config import config

    torch.backends.mha.set_fastpath_enabled(False)
    for entry in ZOO:
        for mode in ("inference", "training"):
            for dtype in ("float32", "bfloat16"):
                torch._dynamo.reset()
                backend.reset()
                torch.manual_seed(0)
                model, inputs = entry.build()
                autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
                with config.patch(cache=False, fallback="strict"), autocast:
                    compiled = torch.compile(model, backend="neuron", dynamic=False)
                    if mode == "inference":
                        with torch.no_grad():
                            compiled(**inputs)
                    else:
                        model.train()
                        loss_of(compiled(**inputs)).backward()
                sources: dict[str, str] = {}
                for i, graph in enumerate(backend.compiled_graphs()):
                    for name, src in graph["sources"]:
                        sources[f"g{i}.{name}"] = src
                _write(out, f"zoo-{entry.name}-{mode}-{dtype}", sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the kernels under")
    parser.add_argument("--zoo", action="store_true", help="also render the model zoo (a few minutes)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    _corpus(args.out)
    if args.zoo:
        _zoo(args.out)


if __name__ == "__main__":
    main()
