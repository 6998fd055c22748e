"""Vision models users bring, through ``torch.compile(backend="neuron")``: torchvision's and timm's classifiers.

Not a pytest module (neither library is a dependency): run ``python tests/models/vision_sweep.py --source timm`` (or
``torchvision``) where the library is installed; ``--train`` adds a forward + backward per model, ``--models a,b``
picks models, ``--size`` overrides the model's own input size. Each model runs in a subprocess with a timeout and
prints one line: ``ok``, ``WRONG`` or ``FAIL <error>``.

Every result is compared with a float64 copy of the model, next to eager float32's own distance from it: a model is
``ok`` when ours is within 10x eager's (and 1e-4 relative for outputs, 1e-3 for gradients). Small batches through
training-mode BatchNorm make some gradients chaotic (a 1e-7 relative change of the input moves them by 10% in
eager too), which a plain comparison with eager float32 would call wrong: in training, eager also runs on the input
moved by 1e-6 relative in three random directions, and twice their largest distance from float64 is within
tolerance too. In training, dropout, drop-path and stochastic depth stay on: every forward starts from the same seed
and the compiled graph draws eager's values (``--drop`` gives timm's models drop_rate = drop_path_rate = 0.1; most
torchvision models have their own). All-zero parameters (ViT heads) are re-drawn so outputs and gradients are not
trivially 0.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
from typing import Any

TORCHVISION = ["resnet18", "alexnet", "squeezenet1_1", "mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x0_5",
               "mnasnet0_5", "efficientnet_b0", "regnet_y_400mf", "densenet121", "convnext_tiny", "googlenet",
               "vgg11_bn", "resnext50_32x4d", "efficientnet_v2_s", "swin_t", "swin_v2_t", "vit_b_16", "maxvit_t"]
TIMM = ["resnet18", "efficientnet_b0", "convnext_atto", "vit_tiny_patch16_224", "deit_tiny_patch16_224",
        "swin_tiny_patch4_window7_224", "regnetx_002", "mobilenetv3_small_050", "rexnet_100", "ghostnet_100",
        "cspresnet50", "dla34", "hrnet_w18_small", "coat_tiny", "levit_128s", "mixer_s32_224", "resmlp_12_224",
        "poolformer_s12", "pit_ti_224", "tnt_s_patch16_224", "crossvit_tiny_240", "cait_xxs24_224",
        "xcit_nano_12_p16_224", "beit_base_patch16_224", "eva02_tiny_patch14_224", "maxvit_nano_rw_256",
        "coatnet_nano_rw_224", "efficientformer_l1", "edgenext_xx_small", "mobilevit_xxs", "fastvit_t8", "repvgg_a0",
        "dpn48b", "nf_resnet26", "gernet_s", "ese_vovnet19b_slim_dw", "res2net50_14w_8s", "skresnet18",
        "selecsls42b", "tresnet_m", "nest_tiny", "twins_pcpvt_small", "visformer_tiny", "convit_tiny", "volo_d1_224",
        "inception_next_tiny", "davit_tiny", "gcvit_xxtiny", "efficientvit_b0", "hiera_tiny_224",
        "mobilenetv4_conv_small", "caformer_s18", "focalnet_tiny_srf", "sequencer2d_s", "densenet121", "xception41",
        "efficientnetv2_rw_t", "lcnet_050", "tinynet_e", "halonet26t", "botnet26t_256", "lambda_resnet26t",
        "cs3darknet_focus_s", "darknet17", "mambaout_femto", "starnet_s1", "rdnet_tiny", "vit_small_patch16_rope_224",
        "fasternet_t0", "shvit_s1", "tiny_vit_5m_224", "repvit_m0_9", "regnetz_005", "resnest14d",
        "sebotnet33ts_256", "gmlp_ti16_224", "pvt_v2_b0", "mvitv2_tiny", "vitamin_small_224", "hgnet_tiny",
        "ghostnetv2_100", "efficientformerv2_s0", "nextvit_small", "dm_nfnet_f0"]


def build(source: str, name: str, size: int, drop: bool = False) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    if source == "timm":
        import timm

        extra = {"drop_rate": 0.1, "drop_path_rate": 0.1} if drop else {}
        model = timm.create_model(name, pretrained=False, num_classes=10, **extra)
        size = size or model.pretrained_cfg.get("input_size", (3, 224, 224))[-1]
    else:
        import torchvision.models as tvm

        size = size or (224 if name.startswith("maxvit") else 80 if name == "inception_v3" else 64)
        kw: dict[str, Any] = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        if name.startswith("vit_"):
            kw["image_size"] = size
        model = tvm.get_model(name, weights=None, num_classes=10, **kw)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    return model.float(), torch.randn(2, 3, size, size)


def rel(a: Any, ref: Any) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def run_one(source: str, name: str, mode: str, size: int, drop: bool = False) -> str:
    import torch

    import neuron_compile  # noqa: F401 (registers the backend)

    model, x = build(source, name, size, drop)
    ref, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    if mode == "eval":
        for m in (model, ref, m64):
            m.eval()
        with torch.no_grad():
            want = m64(x.double())
            ours, eager = rel(compiled(x), want), rel(ref(x), want)
        ok = ours <= max(1e-4, 10 * eager)
        return f"{'ok' if ok else 'WRONG'} out {ours:.1e} (eager {eager:.1e})"
    for m in (model, ref, m64):
        m.train()
    # eager again on the input moved by 1e-6 relative (three directions): how far changes of the size float32
    # rounding makes inside a deep network move this model's numbers
    nudged = [copy.deepcopy(ref) for _ in range(3)]
    torch.manual_seed(1)
    runs = [(compiled, x), (ref, x), (m64, x.double())] + [(n, x * (1 + 1e-6 * torch.randn_like(x))) for n in nudged]
    outs = []
    for f, inp in runs:  # each from the same seed: the same dropout masks
        torch.manual_seed(2)
        outs.append(f(inp))
    for o in outs:
        o.square().mean().backward()
    ours, eager, nudge = rel(outs[0], outs[2]), rel(outs[1], outs[2]), max(rel(o, outs[2]) for o in outs[3:])

    # a parameter whose gradient is ~0 (a bias before a normalization) is compared at 1e-4 of the model's largest
    # gradient, not at its own rounding noise
    floor = 1e-4 * max(q.grad.abs().max().item() for q in m64.parameters() if q.grad is not None)

    def grads(m: Any) -> float:
        return max(((p.grad.double() - q.grad).abs().max() / max(q.grad.abs().max().item(), floor)).item()
                   for p, q in zip(m.parameters(), m64.parameters(), strict=True) if q.grad is not None)

    g_ours, g_eager, g_nudge = grads(model), grads(ref), max(grads(n) for n in nudged)
    ok = ours <= max(1e-4, 10 * eager, 2 * nudge) and g_ours <= max(1e-3, 10 * g_eager, 2 * g_nudge)
    return (f"{'ok' if ok else 'WRONG'} out {ours:.1e} (eager {eager:.1e}, nudged {nudge:.1e}) grads {g_ours:.1e} "
            f"(eager {g_eager:.1e}, nudged {g_nudge:.1e})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=("timm", "torchvision"), default="timm")
    ap.add_argument("--models", default="")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--drop", action="store_true", help="timm models with drop_rate = drop_path_rate = 0.1")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--one", nargs=2, metavar=("NAME", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        try:
            print(run_one(args.source, args.one[0], args.one[1], args.size, args.drop))
        except Exception as exc:  # one line per model: the sweep goes on
            print(f"FAIL {type(exc).__name__}: {exc}".replace("\n", " | ")[:400])
        return 0
    try:
        __import__(args.source)
    except ImportError:
        print(f"{args.source} is not installed: pip install {args.source} (without letting it replace torch)")
        return 2
    names = [n for n in args.models.split(",") if n] or (TIMM if args.source == "timm" else TORCHVISION)
    counts: dict[str, int] = {}
    for name in names:
        for mode in ("eval", "train") if args.train else ("eval",):
            t0 = time.time()
            try:
                cmd = [sys.executable, __file__, "--source", args.source, "--size", str(args.size), "--one", name, mode]
                proc = subprocess.run(cmd + (["--drop"] if args.drop else []), capture_output=True, text=True,
                                      timeout=args.timeout)
                lines = proc.stdout.strip().splitlines()
                line = lines[-1] if lines else f"FAIL exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
            except subprocess.TimeoutExpired:
                line = f"FAIL timeout after {args.timeout} s"
            counts[line.split()[0]] = counts.get(line.split()[0], 0) + 1
            print(f"{name:34} {mode:5} {line} ({time.time() - t0:.0f} s)", flush=True)
    print(" ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
