"""Dropout: Flax's, or one that draws each mask from half the random bits.

On CPUs (and wherever threefry runs in software) generating dropout masks is a large share of
a training step: a quarter of a fine-tuning step's op time on a 2-core Xeon. Flax's
`nn.Dropout` spends one 32-bit random word per element; `HalfWordDropout` splits each word
into two 16-bit draws, so the generator runs half as long. Its keep probability is rounded to
a multiple of 1/65536 (0.9 becomes 0.899994) and kept values are scaled by the exact inverse,
so the expectation is preserved. The masks differ from Flax's, so a run keeps one choice
(`BertConfig.dropout_mask_bits`) from start to resume."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

MASK_BITS = (32, 16)


class HalfWordDropout(nn.Module):
    """`nn.Dropout` with a 16-bit draw per element; same calling convention."""

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        drop_below = round(self.rate * 65536)
        keep_scale = 65536 / (65536 - drop_below)
        # Split along the second-to-last axis (sequence or query positions): measured fastest
        # here, and it is not an axis the mesh shards, so no device needs another's bits.
        axis = x.ndim - 2 if x.ndim >= 3 else x.ndim - 1
        n = x.shape[axis]
        word_shape = list(x.shape)
        word_shape[axis] = (n + 1) // 2
        words = jax.random.bits(self.make_rng("dropout"), tuple(word_shape), jnp.uint32)
        draws = jnp.concatenate([words & 0xFFFF, words >> 16], axis=axis)
        keep = lax.slice_in_dim(draws, 0, n, axis=axis) >= drop_below
        return lax.select(keep, x * jnp.asarray(keep_scale, x.dtype), jnp.zeros_like(x))


def make_dropout(rate: float, mask_bits: int, name: str | None = None) -> nn.Module:
    """The dropout module for `mask_bits` random bits per element (32: Flax's own, whose masks
    every run before this option drew)."""
    if mask_bits == 32:
        return nn.Dropout(rate, name=name)
    if mask_bits == 16:
        return HalfWordDropout(rate, name=name)
    raise ValueError(f"dropout_mask_bits {mask_bits}: expected one of {MASK_BITS}")
