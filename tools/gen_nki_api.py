"""Regenerate ``neuron_compile/nki_api/nki_0_6.json`` from the listing ``neuron_compile/nki_api/nki_0_6.api``.

Usage: ``python tools/gen_nki_api.py`` (writes the JSON) or ``python tools/gen_nki_api.py --check``
(exit 1 when the JSON is stale). The listing is the source kept by hand; the JSON is what the
simulator, the static checker and the tests read at run time. Both live in the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_compile.nki_api.listing import parse_listing  # noqa: E402

LISTING = ROOT / "neuron_compile" / "nki_api" / "nki_0_6.api"
OUT = ROOT / "neuron_compile" / "nki_api" / "nki_0_6.json"


def render(listing: Path = LISTING) -> str:
    """The JSON text generated from ``listing`` (what ``OUT`` must contain)."""
    return json.dumps(parse_listing(listing.read_text()), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON differs from the listing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/gen_nki_api.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date")
        return 0
    OUT.write_text(text)
    data = json.loads(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(data['entries'])} names, {len(data['removed'])} removed forms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
