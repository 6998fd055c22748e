"""The model zoo: small, randomly initialised real models (no downloads) with realistic inputs.

Each entry builds a model and its inputs (a padded batch with an attention mask where the model takes
one) and says how to get a scalar loss for a training step. Shared by the zoo tests
(``tests/models/test_zoo.py``) and ``benchmarks/compile_time.py --zoo``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass
class Entry:
    name: str
    build: Callable[[], tuple[nn.Module, dict[str, Any]]]  # model (eval mode), keyword inputs
    family: str = "hf"
    needs: tuple[str, ...] = ()  # python packages
    xfail: dict[str, str] = field(default_factory=dict)  # mode -> reason (ops still refused)


def _ids(vocab: int, batch: int = 2, seq: int = 8, pad_from: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, pad_from:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def no_dropout(config: Any) -> Any:
    """A Hugging Face config with every dropout probability set to 0 (modules copy them at init), so that
    training-mode eager and compiled runs compute the same function."""
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            no_dropout(getattr(config, sub))
    return config


def _hf(cls_name: str, config_name: str, **cfg: Any) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        import transformers

        torch.manual_seed(0)
        config = no_dropout(getattr(transformers, config_name)(**cfg))
        model = getattr(transformers, cls_name)(config).eval()
        return model, _ids(config.vocab_size)

    return build


def _t5() -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(no_dropout(cfg)).eval()
    inputs = _ids(64)
    inputs["decoder_input_ids"] = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, inputs


def _vit() -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64)
    return transformers.ViTModel(no_dropout(cfg)).eval(), {"pixel_values": torch.randn(2, 3, 16, 16)}


def _clip() -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    torch.manual_seed(0)
    text = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16}
    vision = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4}
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    inputs = _ids(64)
    inputs["pixel_values"] = torch.randn(2, 3, 16, 16)
    return transformers.CLIPModel(no_dropout(cfg)).eval(), inputs


def _whisper() -> tuple[nn.Module, dict[str, Any]]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=64, num_mel_bins=8, encoder_layers=2, decoder_layers=2,
                                     d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=8,
                                     max_target_positions=16, pad_token_id=0, decoder_start_token_id=1)
    model = transformers.WhisperForConditionalGeneration(no_dropout(cfg)).eval()
    feats = torch.randn(2, 8, 16)  # (batch, mel bins, frames = 2 * max_source_positions)
    dec = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, {"input_features": feats, "decoder_input_ids": dec}


class _MLPMixer(nn.Module):
    def __init__(self, patches: int = 16, dim: int = 32, depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(12, dim)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict({
                "norm1": nn.LayerNorm(dim), "tok": nn.Sequential(nn.Linear(patches, 64), nn.GELU(), nn.Linear(64, patches)),
                "norm2": nn.LayerNorm(dim), "ch": nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))}))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = x.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(b, 16, 12)
        x = self.embed(x)
        for blk in self.blocks:
            x = x + blk["tok"](blk["norm1"](x).transpose(1, 2)).transpose(1, 2)
            x = x + blk["ch"](blk["norm2"](x))
        return self.head(self.norm(x).mean(1))


def _nn(build: Callable[[], tuple[nn.Module, dict[str, Any]]]) -> Callable[[], tuple[nn.Module, dict[str, Any]]]:
    def wrapped() -> tuple[nn.Module, dict[str, Any]]:
        torch.manual_seed(0)
        return build()

    return wrapped


def _mha() -> tuple[nn.Module, dict[str, Any]]:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]

    kpm = torch.zeros(2, 8, dtype=torch.bool)
    kpm[1, 5:] = True
    return M().eval(), {"x": torch.randn(2, 8, 32), "key_padding_mask": kpm}


def _encoder() -> tuple[nn.Module, dict[str, Any]]:
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    kpm = torch.zeros(2, 8, dtype=torch.bool)
    kpm[1, 5:] = True
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), {
        "src": torch.randn(2, 8, 32), "src_key_padding_mask": kpm}


def _decoder() -> tuple[nn.Module, dict[str, Any]]:
    layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerDecoder(layer, 2).eval(), {
        "tgt": torch.randn(2, 6, 32), "memory": torch.randn(2, 8, 32),
        "tgt_mask": nn.Transformer.generate_square_subsequent_mask(6), "tgt_is_causal": True}


def _llama_reference() -> tuple[nn.Module, dict[str, Any]]:
    """A Llama block as Meta's reference code and torchtitan write it: rotary embeddings as a complex product with
    a complex64 ``freqs_cis`` buffer (``torch.polar``, ``view_as_complex`` / ``view_as_real``), RMSNorm, SwiGLU."""
    dim, heads, seq = 32, 4, 8
    hd = dim // heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wqkv, self.wo = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.w13, self.w2 = nn.Linear(dim, 128, bias=False), nn.Linear(64, dim, bias=False)
            self.n1, self.n2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)

        def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
            b = x.shape[0]
            q, k, v = self.wqkv(self.n1(x)).view(b, seq, 3, heads, hd).unbind(2)
            rot = []
            for t in (q, k):
                tc = torch.view_as_complex(t.float().reshape(b, seq, heads, hd // 2, 2))
                rot.append(torch.view_as_real(tc * freqs_cis.view(1, seq, 1, hd // 2)).flatten(3).type_as(t))
            y = nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (*rot, v)), is_causal=True)
            x = x + self.wo(y.transpose(1, 2).reshape(b, seq, dim))
            gate, up = self.w13(self.n2(x)).chunk(2, -1)
            return x + self.w2(nn.functional.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = nn.Embedding(64, dim), nn.Linear(dim, 64, bias=False)
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            freqs = torch.outer(torch.arange(seq).float(), 1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd))
            self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs), persistent=False)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            h = self.emb(input_ids)
            for blk in self.blocks:
                h = blk(h, self.freqs_cis)
            return self.out(h)

    return Llama().eval(), {"input_ids": _ids(64)["input_ids"]}


def _examples() -> Any:
    """examples/cnn_models.py (the ResNet-18-style network and the UNet block of the CNN examples)."""
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import cnn_models

    return cnn_models


def _resnet() -> tuple[nn.Module, dict[str, Any]]:
    model = _examples().ResNetSmall()
    for m in model.modules():  # non-trivial running statistics, so eval-mode folding is exercised
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval(), {"x": torch.randn(2, 3, 32, 32)}


class _DiffusionStep(nn.Module):
    """A DDPM training step's forward: noise the clean image with ``randn_like`` at each sample's noise level,
    predict with a UNet block (GroupNorm, SiLU, strided and transposed convs, nearest upsampling) followed by a
    spatial self-attention block, and return the noise-prediction residual."""

    def __init__(self) -> None:
        super().__init__()
        self.unet = _examples().UNetSmall()
        self.norm = nn.GroupNorm(1, 3)
        self.proj_in = nn.Conv2d(3, 16, 1)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.proj_out = nn.Conv2d(16, 3, 1)

    def forward(self, x0: torch.Tensor, t_emb: torch.Tensor, alpha_bar: torch.Tensor) -> torch.Tensor:
        noise = torch.randn_like(x0)
        a = alpha_bar[:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        h = self.unet(xt, t_emb)
        b, _, height, width = h.shape
        s = self.proj_in(self.norm(h)).flatten(2).transpose(1, 2)
        s = self.attn(s, s, s, need_weights=False)[0]
        h = h + self.proj_out(s.transpose(1, 2).reshape(b, 16, height, width))
        return h - noise


def _diffusion() -> tuple[nn.Module, dict[str, Any]]:
    return _DiffusionStep().eval(), {"x0": torch.randn(2, 3, 8, 8), "t_emb": torch.randn(2, 16),
                                     "alpha_bar": torch.tensor([0.9, 0.3])}


def _mixer() -> tuple[nn.Module, dict[str, Any]]:
    return _MLPMixer().eval(), {"x": torch.randn(2, 3, 8, 8)}


ZOO: list[Entry] = [
    Entry("gpt2", _hf("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=32, n_head=4, vocab_size=64,
                      n_positions=32), needs=("transformers",)),
    Entry("bert", _hf("BertModel", "BertConfig", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                      intermediate_size=64, vocab_size=64, max_position_embeddings=32), needs=("transformers",)),
    Entry("llama", _hf("LlamaForCausalLM", "LlamaConfig", num_hidden_layers=2, hidden_size=32,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                       max_position_embeddings=32), needs=("transformers",)),
    Entry("mistral", _hf("MistralForCausalLM", "MistralConfig", num_hidden_layers=2, hidden_size=32,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                         max_position_embeddings=32, sliding_window=4), needs=("transformers",)),
    Entry("qwen2", _hf("Qwen2ForCausalLM", "Qwen2Config", num_hidden_layers=2, hidden_size=32,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                       max_position_embeddings=32), needs=("transformers",)),
    Entry("mixtral", _hf("MixtralForCausalLM", "MixtralConfig", num_hidden_layers=2, hidden_size=32,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                         max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2),
          needs=("transformers",)),
    # ALiBi: an additive bias of its own per head, so the attention kernel loads its mask per head and chunk
    Entry("bloom", _hf("BloomForCausalLM", "BloomConfig", n_layer=2, hidden_size=32, n_head=4, vocab_size=64),
          needs=("transformers",)),
    # disentangled attention: content-to-position and position-to-content terms gathered by relative distance
    Entry("deberta_v2", _hf("DebertaV2Model", "DebertaV2Config", num_hidden_layers=2, hidden_size=32,
                            num_attention_heads=4, intermediate_size=64, vocab_size=64, max_position_embeddings=32),
          needs=("transformers",)),
    # an encoder-decoder whose decoder inputs are the shifted input ids: padding mask, causal mask, cross-attention
    Entry("bart", _hf("BartModel", "BartConfig", vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      max_position_embeddings=32), needs=("transformers",)),
    Entry("t5", _t5, needs=("transformers",)),
    Entry("vit", _vit, needs=("transformers",)),
    Entry("clip", _clip, needs=("transformers",)),
    Entry("whisper", _whisper, needs=("transformers",)),
    Entry("multihead_attention", _nn(_mha), family="nn"),
    Entry("transformer_encoder", _nn(_encoder), family="nn"),
    Entry("transformer_decoder", _nn(_decoder), family="nn"),
    Entry("mlp_mixer", _nn(_mixer), family="nn"),
    Entry("llama_reference", _nn(_llama_reference), family="nn"),
    Entry("resnet", _nn(_resnet), family="cnn"),
    Entry("diffusion_unet", _nn(_diffusion), family="cnn"),
]


def first_tensor(out: Any) -> torch.Tensor:
    """The main output of a model call (logits / last hidden state / the tensor itself)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state", "logits_per_image"):
        v = getattr(out, key, None) if not isinstance(out, dict) else out.get(key)
        if isinstance(v, torch.Tensor):
            return v
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    raise TypeError(f"no tensor output in {type(out).__name__}")


def loss_of(out: Any) -> torch.Tensor:
    """A scalar training loss touching the main output (weighted so every element gets a distinct grad)."""
    t = first_tensor(out).float()
    w = torch.linspace(-1.0, 1.0, t.numel()).reshape(t.shape)
    return (t * w).sum()
