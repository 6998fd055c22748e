"""Shape bucketing: padded batch and masked sequence dims give eager numbers with few compiles; unsafe cases refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import neuron_compile
from neuron_compile.bucketing import bucket_for, bucketed
from neuron_compile.errors import BucketingError


def test_bucket_for() -> None:
    assert [bucket_for(n, "pow2") for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    assert [bucket_for(n, [16, 4, 8]) for n in (1, 4, 5, 16)] == [4, 4, 8, 16]
    with pytest.raises(BucketingError, match=r"has size 17, larger than the largest bucket 16 \(buckets \[4, 8, 16\]\); "
                                             r"add a bucket >= 17"):
        bucket_for(17, [4, 8, 16], "the batch dim (0)")


def test_five_batch_sizes_three_buckets_three_compiles() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 5)).eval()
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    run = bucketed(compiled, batch_dim=0, buckets="pow2")
    with torch.no_grad():
        for batch in (3, 4, 6, 7, 9):  # -> 4, 4, 8, 8, 16
            x = torch.randn(batch, 12)
            out = run(x)
            assert out.shape == (batch, 5)
            torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-4)
    assert run.compiled_buckets == [(4, None), (8, None), (16, None)]
    assert len(neuron_compile.get_compile_metrics()) == 3
    shapes = [m["input_shapes"] for m in neuron_compile.get_compile_metrics()]
    assert [[b, 12] in s for b, s in zip((4, 8, 16), shapes, strict=True)] == [True, True, True]
    assert run.report().splitlines() == ["bucketing: 3 bucket(s) compiled", "  batch=4: 2 call(s)",
                                         "  batch=8: 2 call(s)", "  batch=16: 1 call(s)"]


class MaskedEncoder(nn.Module):
    """Token embedding + one masked self-attention layer; per-token outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 4.0
        scores = scores.masked_fill(attention_mask[:, None, :] == 0, -1e9)
        return self.out(torch.softmax(scores, dim=-1) @ v) + h


def test_sequence_dim_padding_is_masked() -> None:
    torch.manual_seed(0)
    model = MaskedEncoder().eval()
    run = bucketed(torch.compile(model, backend="neuron", dynamic=False), batch_dim=0, buckets=[2, 4],
                   seq_dim=1, seq_buckets=[8, 16], mask="attention_mask")
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (2, 11)):
            ids = torch.randint(0, 50, (batch, seq))
            mask = torch.ones(batch, seq, dtype=torch.long)
            mask[0, -2:] = 0  # the caller's own padding stays masked too
            out = run(ids, attention_mask=mask)
            assert out.shape == (batch, seq, 16)
            torch.testing.assert_close(out, model(ids, mask), atol=2e-5, rtol=1e-4)
    assert run.compiled_buckets == [(2, 8), (2, 16), (4, 8)]


def test_refusals() -> None:
    with pytest.raises(BucketingError, match="only safe when the model takes an attention mask"):
        bucketed(lambda x: x, seq_dim=1)
    run = bucketed(lambda x: x * 2, buckets=[2, 4])
    with pytest.raises(BucketingError, match="has size 5, larger than the largest bucket 4"):
        run(torch.randn(5, 3))
    loss = bucketed(lambda x: (x * x).sum(0), buckets=[4])
    with pytest.raises(BucketingError, match=r"output has shape \[3\], whose dim 0 is not the padded batch size 4: "
                                             r"the function mixes the batch dim"):
        loss(torch.randn(2, 3))
    bn = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).train()
    with pytest.raises(BucketingError, match=r"1 is a BatchNorm in training mode: .*call model.eval\(\)"):
        bucketed(bn, buckets=[4])(torch.randn(2, 3))
    masked = bucketed(lambda ids, attention_mask=None: ids, seq_dim=1, mask="attention_mask")
    with pytest.raises(BucketingError, match="the attention mask argument 'attention_mask' was not passed"):
        masked(torch.zeros(2, 3))
