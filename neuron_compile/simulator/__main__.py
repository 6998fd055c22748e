"""``python -m neuron_compile.simulator --list-md``: print the implemented-name list (Markdown).

``--write-doc`` rewrites the generated section of ``docs/simulator.md`` in place.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from neuron_compile.simulator import implemented_names

log = logging.getLogger(__name__)

BEGIN = "<!-- BEGIN GENERATED: implemented names (python -m neuron_compile.simulator --write-doc) -->"
END = "<!-- END GENERATED -->"


def list_md() -> str:
    lines = []
    for module, names in implemented_names().items():
        lines.append(f"- `{module}` ({len(names)}): " + ", ".join(f"`{n}`" for n in names))
    return "\n".join(lines) + "\n"


def render_doc(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{list_md()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m neuron_compile.simulator")
    p.add_argument("--list-md", action="store_true", help="print the implemented names as Markdown")
    p.add_argument("--write-doc", metavar="PATH", nargs="?", const="docs/simulator.md",
                   help="rewrite the generated section of docs/simulator.md")
    args = p.parse_args(argv)
    if args.write_doc:
        path = Path(args.write_doc)
        path.write_text(render_doc(path.read_text()))
        return 0
    sys.stdout.write(list_md())
    return 0


if __name__ == "__main__":
    sys.exit(main())
