"""The NKI 0.6 API listing ships with the package: its generated JSON is current, its parser refuses
malformed lines, its facts are the documented ones, and the checkout reads nothing outside itself."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_compile import nki_api
from neuron_compile.nki_api.checker import check_source_against_api
from neuron_compile.nki_api.listing import ListingError, parse_listing

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "neuron_compile" / "nki_api"


def test_generated_json_is_current() -> None:
    expected = json.dumps(parse_listing((PKG / "nki_0_6.api").read_text()), indent=1, sort_keys=True) + "\n"
    assert (PKG / "nki_0_6.json").read_text() == expected, "run: python tools/gen_nki_api.py"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_nki_api.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "is up to date" in proc.stdout


def test_a_stale_json_is_detected(tmp_path: Path) -> None:
    listing = (PKG / "nki_0_6.api").read_text()
    edited = listing.replace("function topk(val_dst, idx_dst, src, n, name=None)",
                             "function topk(val_dst, idx_dst, src, k, name=None)")
    assert edited != listing
    fresh = parse_listing(edited)
    assert fresh != nki_api.api()
    (topk,) = [e for e in fresh["entries"] if e["qualname"] == "topk"]
    assert [p[0] for p in topk["params"]] == ["val_dst", "idx_dst", "src", "k", "name"]


@pytest.mark.parametrize(("text", "message"), [
    ("function jit(fn=None)", "line 1: a name before the first [module] section"),
    ("[nki]\nfunctoin jit(fn=None)", "line 2: unknown kind 'functoin'"),
    ("[nki]\nfunction jit(fn=None", "line 2: bad parameter list '(fn=None'"),
    ("[nki]\nfunction jit() | colour=red", "line 2: unknown attribute 'colour'"),
    ("[nki]\nfunction jit() | shiny", "line 2: unknown flag 'shiny'"),
    ("[nki]\nfunction jit()\nfunction jit()", "line 3: nki.jit is listed twice"),
    ("[removed]\nremoved nki.x | status=gone", "line 2: a removed line needs both status= and use="),
])
def test_malformed_listing_lines_are_refused(text: str, message: str) -> None:
    with pytest.raises(ListingError) as info:
        parse_listing(text)
    assert str(info.value).startswith(message), str(info.value)


def test_documented_facts() -> None:
    assert len(nki_api.isa_instructions()) == 67
    mm = nki_api.entry("nki.isa", "nc_matmul")
    assert mm is not None and mm["engine"] == "tensor"
    assert [p[0] for p in mm["params"]][:3] == ["dst", "stationary", "moving"]
    assert dict((p[0], p[2]) for p in mm["params"])["perf_mode"] == "matmul_perf_mode.none"
    assert nki_api.entry("nki.isa", "activate2")["min_nc"] == 4
    assert nki_api.entry("nki.language", "dynamic_range")["deprecated"].startswith("0.6.0")
    assert nki_api.entry("nki.language", "_TileSize.psum_bank_fmax")["value"] == "512"
    assert "sendrecv" in nki_api.isa_instructions()
    assert "topk" not in nki_api.dst_first_isa_ops() and "tensor_copy" in nki_api.dst_first_isa_ops()
    assert nki_api.members("nki.isa.dge_mode") == ["hwdge", "none", "swdge", "unknown"]


def test_checker_knows_the_extra_namespaces() -> None:
    source = ("import nki\nimport nki.language as nl\nimport nki.typing as nt\n"
              "from nki.isa.constants import dge_mode, oob_mode\n\n"
              "import nki.isa as nisa\n"
              "def k(a: nt.tensor[128, 512], dt: nki.dtype = nl.bfloat16):\n"
              "    return dge_mode.swdge, oob_mode.skip, nisa.constants.dge_mode.hwdge\n")
    assert check_source_against_api(source) == []
    bad = check_source_against_api("from nki.isa.constants import dge_mode\nx = dge_mode.turbo\n")
    assert bad == ["line 2: nki.isa.dge_mode.turbo: not a public name of NKI 0.6"]


def test_the_checkout_reads_no_path_outside_itself() -> None:
    # The team's notes folder sits beside the checkout: its absolute path, a relative reference to it, and its API
    # listing's path (built at run time, so this file names no path outside the repository and does not match itself)
    sibling = "sha" + "red"
    needles = (str(ROOT.parent / sibling), f"../{sibling}/", f"{sibling}/nki/api.json")
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, timeout=60) \
        if (ROOT / ".git").exists() else None  # CI tests a copy without .git
    paths = files.stdout.split() if files is not None and files.returncode == 0 else [
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    assert len(paths) > 100
    offenders = []
    for rel in paths:
        path = ROOT / rel
        if path.suffix not in (".py", ".md", ".toml", ".txt", ".j2", ".cfg", ".sh", ".api", ".json", ""):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{rel}: {n}" for n in needles if n in text]
    assert offenders == []


def test_checker_refuses_a_dma_queue_without_the_hardware_dge() -> None:
    """nki.isa.dma_copy: engine= is "only valid when dge_mode=nisa.dge_mode.hwdge"."""
    head = "import nki.isa as nisa\n"
    bad = check_source_against_api(head + "nisa.dma_copy(dst=a, src=b, engine=nisa.engine.sync)\n")
    assert bad == ["line 2: nisa.dma_copy(engine=...): only valid with dge_mode=nisa.dge_mode.hwdge (the engine names "
                   "the sequencer driving the hardware DGE)"]
    assert check_source_against_api(
        head + "nisa.dma_copy(dst=a, src=b, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)\n") == []

