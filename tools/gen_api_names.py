"""Regenerate ``neuron_compile/simulator/api_names.json`` from the shared NKI API listing.

Usage: ``python tools/gen_api_names.py [path/to/api.json]`` (default ``../shared/nki/api.json``).
The installed package reads only its own copy, never the shared folder.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "neuron_compile" / "simulator" / "api_names.json"


def build(api: dict) -> dict:
    modules: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    for e in api["entries"]:
        qual = e["qualname"]
        if "." in qual:
            members.setdefault(f"{e['module']}.{qual.split('.')[0]}", []).append(qual.split(".", 1)[1])
            continue
        if e["kind"] == "enum_member":
            continue
        names = modules.setdefault(e["module"], [])
        if qual not in names:
            names.append(qual)
    removed: dict[str, str] = {}
    for r in api["removed_or_renamed"]:
        prefix = ""
        for part in r["name"].split(" / "):
            part = re.sub(r"\s*\(.*\)$", "", part.strip())
            if part.startswith("nki.") or part.startswith("neuronxcc"):
                prefix = part.rsplit(".", 1)[0] + "."
            elif prefix and re.fullmatch(r"\w+", part):
                part = prefix + part
            removed[part] = f"{r['status']}; use {r['use']}"
    return {"source": api["source"], "modules": {k: sorted(v) for k, v in modules.items()},
            "members": {k: sorted(set(v)) for k, v in members.items()}, "removed": removed}


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else ROOT.parent / "shared" / "nki" / "api.json"
    data = build(json.loads(src.read_text()))
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({sum(len(v) for v in data['modules'].values())} names)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
