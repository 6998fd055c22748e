"""Attention kernels alone under the cost model, on trn2 (LNC=2 unless ``--lnc 1``), the way ``kernels.py`` measures.

Run ``python benchmarks/attention_shapes.py`` (``--only gpt2`` for one shape). Rows: issue 5's workload (c) (causal
bf16 B4 H16 S2048 D128, q/k/v contiguous [b, h, s, d]) and GPT-2 small's attention (B4 H12 S1024 D64 causal bf16,
q/k/v views of one fused projection, [b, s, 3 * h * d] transposed to [b, h, s, d], as ``examples/models.py`` feeds
it), which workload (g) calls 12 times; a few smaller shapes (ragged, odd batch). Each row prints what ``kernels.py``
prints (estimate, roofline, eff, occupancies) plus the estimate when every guard trips, so one shape can be measured
in seconds instead of the ~6 minutes of ``kernels.py --only g``. Nothing runs on the simulator.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import measure  # noqa: E402

log = logging.getLogger(__name__)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _contiguous(b: int, h: int, s: int, d: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    return _causal, [torch.randn(b, h, s, d, dtype=torch.bfloat16) for _ in range(3)]


def _fused_projection(b: int, h: int, s: int, d: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """GPT-2's layout: one [b, s, 3 * h * d] projection split into q, k, v and viewed as [b, h, s, d]."""
    def attn(qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
        return _causal(q, k, v)

    return attn, [torch.randn(b, s, 3 * h * d, dtype=torch.bfloat16)]


def _masked(b: int, h: int, s: int, d: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """A Hugging Face encoder's attention: an additive [b, 1, s, s] mask (0, or the dtype's min past each sequence's
    length), which every model with an attention mask runs through the standard kernel."""
    mask = torch.zeros(b, 1, s, s, dtype=torch.bfloat16)
    mask[1:, :, :, s * 3 // 4:] = torch.finfo(torch.bfloat16).min

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    return attn, [torch.randn(b, h, s, d, dtype=torch.bfloat16) for _ in range(3)] + [mask]


def _fp16(b: int, h: int, s: int, d: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    return _causal, [torch.randn(b, h, s, d, dtype=torch.float16) for _ in range(3)]


SHAPES: dict[str, tuple[str, Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]]]] = {
    "c": ("causal B4 H16 S2048 D128 (workload c)", lambda: _contiguous(4, 16, 2048, 128)),
    "gpt2": ("GPT-2 attention B4 H12 S1024 D64 (workload g)", lambda: _fused_projection(4, 12, 1024, 64)),
    "odd": ("causal B3 H4 S700 D64 (odd batch, ragged)", lambda: _contiguous(3, 4, 700, 64)),
    "one": ("causal B1 H8 S1024 D128 (one batch)", lambda: _contiguous(1, 8, 1024, 128)),
    "masked": ("masked B2 H16 S1024 D128 (HF encoder mask)", lambda: _masked(2, 16, 1024, 128)),
    "bert": ("masked B8 H12 S512 D64 (BERT-base mask)", lambda: _masked(8, 12, 512, 64)),
    "fp16": ("causal fp16 B2 H8 S2048 D128 (exact kernel)", lambda: _fp16(2, 8, 2048, 128)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated shape keys ({', '.join(SHAPES)}; default: all)")
    parser.add_argument("--lnc", type=int, default=0, choices=(0, 1, 2))
    args = parser.parse_args(argv)
    keys = [x.strip() for x in args.only.split(",") if x.strip()] or list(SHAPES)
    print(f"trn2, lnc={args.lnc or 2}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'shape':<48} {'est us':>9} {'roof us':>8} {'eff':>6} {'tripped us':>10} {'tr eff':>6} {'cores':>5}  "
          f"{'occ PE/DVE/ACT/POOL/DMA':<24} {'s':>5}")
    for key in keys:
        title, make = SHAPES[key]
        fn, inputs = make()
        r = measure(title, fn, inputs, "trn2", args.lnc)
        occ = "/".join(f"{r['occupancy'].get(e, 0) * 100:.0f}" for e in ("tensor", "vector", "scalar", "gpsimd", "dma"))
        tripped = r["guard_tripped_us"] if r["guarded_calls"] else r["estimated_us"]
        print(f"{title:<48} {r['estimated_us']:>9.1f} {r['roofline_us']:>8.1f} {r['efficiency']:>6.1%} "
              f"{tripped:>10.1f} {r['roofline_us'] / tripped:>6.1%} {r['cores']:>5}  {occ:<24} {r['seconds']:>5.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
