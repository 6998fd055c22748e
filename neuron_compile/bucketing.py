"""Shape bucketing: pad input dims up to a few bucket sizes so a static-shape backend compiles few graphs.

:func:`bucketed` wraps a function (usually ``torch.compile(model, backend="neuron", dynamic=False)``):

- **batch dim** (``batch_dim``, default 0): the batch size is the first tensor argument's size along
  ``batch_dim``; every tensor argument with that size there is padded with zeros up to the bucket
  (others, e.g. weights, pass unchanged); outputs whose size along
  ``output_batch_dim`` equals the bucket are sliced back. Correct whenever batch rows are
  independent (no batch statistics: a module with BatchNorm in training mode is refused).
- **sequence dim** (``seq_dim``, optional): needs ``mask`` (the name or position of the attention
  mask argument) so padded positions are masked: token arguments are padded with ``pad_value``,
  the mask with 0 (masked out); outputs are sliced back along ``output_seq_dim``.

Buckets are ``"pow2"`` (the next power of two) or an explicit sorted list. Refused, with a
:class:`~neuron_compile.errors.BucketingError` naming the argument and the fix: an input larger
than the largest bucket, a sequence dim without a mask, a BatchNorm in training mode, and an output that is not sliceable (e.g. a loss reduced over the batch, which padding would
change). :meth:`Bucketed.report` says which buckets were compiled and how often each ran.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from neuron_compile.errors import BucketingError

log = logging.getLogger(__name__)

Buckets = str | Sequence[int]


def bucket_for(size: int, buckets: Buckets, what: str = "dim") -> int:
    """The smallest bucket >= ``size``."""
    if size < 1:
        raise BucketingError(f"bucketing: {what} has size {size}; only sizes >= 1 can be bucketed")
    if buckets == "pow2":
        return 1 << (size - 1).bit_length()
    if isinstance(buckets, str):
        raise BucketingError(f"bucketing: buckets={buckets!r}: expected 'pow2' or a list of sizes")
    sizes = sorted(int(b) for b in buckets)
    if not sizes or sizes[0] < 1:
        raise BucketingError(f"bucketing: buckets={list(buckets)!r}: expected positive sizes")
    for b in sizes:
        if b >= size:
            return b
    raise BucketingError(f"bucketing: {what} has size {size}, larger than the largest bucket {sizes[-1]} "
                         f"(buckets {sizes}); add a bucket >= {size} or split the input")


def _pad(t: torch.Tensor, dim: int, to: int, value: float) -> torch.Tensor:
    extra = to - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    if t.dtype == torch.bool:
        return F.pad(t.to(torch.uint8), pad, value=int(value)).to(torch.bool)
    return F.pad(t, pad, value=value)


class Bucketed:
    """The wrapper :func:`bucketed` returns."""

    def __init__(self, fn: Callable[..., Any], *, batch_dim: int | None = 0, buckets: Buckets = "pow2",
                 seq_dim: int | None = None, seq_buckets: Buckets = "pow2", mask: str | int | None = None,
                 pad_value: float = 0, output_batch_dim: int = 0, output_seq_dim: int | None = None) -> None:
        if batch_dim is None and seq_dim is None:
            raise BucketingError("bucketing: nothing to bucket (batch_dim=None and seq_dim=None)")
        if seq_dim is not None and mask is None:
            raise BucketingError(
                f"bucketing: padding the sequence dim ({seq_dim}) is only safe when the model takes an attention "
                f"mask that hides the padded positions; pass mask='attention_mask' (the argument's name or "
                f"position), or bucket the batch dim only")
        self.fn = fn
        self.batch_dim = batch_dim
        self.buckets = buckets
        self.seq_dim = seq_dim
        self.seq_buckets = seq_buckets
        self.mask = mask
        self.pad_value = pad_value
        self.output_batch_dim = output_batch_dim
        self.output_seq_dim = output_seq_dim if output_seq_dim is not None else seq_dim
        self.calls: Counter[tuple[int | None, int | None]] = Counter()
        self._checked_module = False

    # -- reporting ----------------------------------------------------------------------------------
    @property
    def compiled_buckets(self) -> list[tuple[int | None, int | None]]:
        """The (batch bucket, seq bucket) shapes run so far: one static compile each."""
        return sorted(self.calls, key=lambda b: (b[0] or 0, b[1] or 0))

    def report(self) -> str:
        lines = [f"bucketing: {len(self.calls)} bucket(s) compiled"]
        for b in self.compiled_buckets:
            what = ", ".join(f"{n}={v}" for n, v in (("batch", b[0]), ("seq", b[1])) if v is not None)
            lines.append(f"  {what}: {self.calls[b]} call(s)")
        return "\n".join(lines)

    # -- calling ------------------------------------------------------------------------------------
    def _check_module(self) -> None:
        if self._checked_module:
            return
        self._checked_module = True
        module = getattr(self.fn, "_orig_mod", self.fn)
        if isinstance(module, torch.nn.Module) and self.batch_dim is not None:
            for name, m in module.named_modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training:
                    raise BucketingError(
                        f"bucketing: {name or type(module).__name__} is a BatchNorm in training mode: its batch "
                        f"statistics would include the padded rows; call model.eval() or do not bucket the batch dim")

    def _mask_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | int | None:
        if self.mask is None or isinstance(self.mask, int):
            return self.mask
        if self.mask in kwargs:
            return self.mask
        try:
            params = list(inspect.signature(getattr(self.fn, "_orig_mod", self.fn)).parameters)
        except (TypeError, ValueError):
            params = []
        if self.mask in params and params.index(self.mask) < len(args):
            return params.index(self.mask)
        raise BucketingError(f"bucketing: the attention mask argument {self.mask!r} was not passed; the sequence "
                             f"dim can only be padded when the padded positions are masked")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check_module()
        items: list[tuple[str | int, torch.Tensor]] = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        items += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        if not items:
            raise BucketingError("bucketing: no tensor arguments to bucket")
        mask_key = self._mask_key(args, kwargs)
        batch = self._size(items, self.batch_dim, "batch")
        seq = self._size(items, self.seq_dim, "sequence")
        b_bucket = bucket_for(batch, self.buckets, f"the batch dim ({self.batch_dim})") if batch is not None else None
        s_bucket = bucket_for(seq, self.seq_buckets, f"the sequence dim ({self.seq_dim})") if seq is not None else None
        new_args = list(args)
        new_kwargs = dict(kwargs)
        for key, t in items:
            value = 0 if key == mask_key else self.pad_value
            if b_bucket is not None and t.dim() > self.batch_dim and t.shape[self.batch_dim] == batch:
                t = _pad(t, self.batch_dim, b_bucket, value)
            if s_bucket is not None and t.dim() > self.seq_dim and t.shape[self.seq_dim] == seq:
                t = _pad(t, self.seq_dim, s_bucket, value)
            if isinstance(key, int):
                new_args[key] = t
            else:
                new_kwargs[key] = t
        bucket = (b_bucket, s_bucket)
        if bucket not in self.calls:
            log.info("bucketing: new bucket batch=%s seq=%s (input batch=%s seq=%s)", b_bucket, s_bucket, batch, seq)
        self.calls[bucket] += 1
        out = self.fn(*new_args, **new_kwargs)
        return self._slice(out, batch, b_bucket, seq, s_bucket)

    def _size(self, items: list[tuple[str | int, torch.Tensor]], dim: int | None, what: str) -> int | None:
        if dim is None:
            return None
        sizes = {key: t.shape[dim] for key, t in items if t.dim() > dim}
        if not sizes:
            raise BucketingError(f"bucketing: no tensor argument has a {what} dim {dim}")
        return int(next(iter(sizes.values())))

    def _slice(self, out: Any, batch: int | None, b_bucket: int | None, seq: int | None,
               s_bucket: int | None, path: str = "output") -> Any:
        if isinstance(out, torch.Tensor):
            if b_bucket is not None:
                out = self._cut(out, self.output_batch_dim, batch, b_bucket, "batch", path)
            if s_bucket is not None and self.output_seq_dim is not None:
                out = self._cut(out, self.output_seq_dim, seq, s_bucket, "sequence", path)
            return out
        if isinstance(out, (list, tuple)):
            items = [self._slice(o, batch, b_bucket, seq, s_bucket, f"{path}[{i}]") for i, o in enumerate(out)]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        if isinstance(out, dict):
            return {k: self._slice(v, batch, b_bucket, seq, s_bucket, f"{path}[{k!r}]") for k, v in out.items()}
        return out

    @staticmethod
    def _cut(t: torch.Tensor, dim: int, size: int | None, bucket: int, what: str, path: str) -> torch.Tensor:
        if bucket == size:
            return t
        if t.dim() <= dim or t.shape[dim] != bucket:
            raise BucketingError(
                f"bucketing: {path} has shape {list(t.shape)}, whose dim {dim} is not the padded {what} size "
                f"{bucket}: the function mixes the {what} dim (e.g. a loss reduced over it), so padding would "
                f"change the result; return per-example values and reduce outside, or do not bucket this dim")
        return t.narrow(dim, 0, int(size or 0))


def bucketed(fn: Callable[..., Any], **options: Any) -> Bucketed:
    """Wrap ``fn`` so chosen input dims are padded to buckets (see the module docstring for ``options``)."""
    return Bucketed(fn, **options)
