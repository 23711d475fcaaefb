"""Dropout: Flax's, or one that draws each mask from half the random bits; and a cheap
generator for those bits.

On CPUs (and wherever threefry runs in software) generating dropout masks is a large share of
a training step: a quarter of a fine-tuning step's op time on a 2-core Xeon. Flax's
`nn.Dropout` spends one 32-bit random word per element; `HalfWordDropout` splits each word
into two 16-bit draws, so the generator runs half as long. Its keep probability is rounded to
a multiple of 1/65536 (0.9 becomes 0.899994) and kept values are scaled by the exact inverse,
so the expectation is preserved. The masks differ from Flax's, so a run keeps one choice
(`BertConfig.dropout_mask_bits`) from start to resume.

`COUNTER_HASH` (`dropout_rng='counter_hash'`) is a JAX generator for dropout keys whose bits
are two rounds of an integer hash of each element's index: a few multiplies and shifts per
32-bit word where threefry spends twenty rounds."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
from jax import lax

MASK_BITS = (32, 16)


def _mix32(x):
    """A bijective 32-bit integer hash with full avalanche (the `lowbias32` constants from
    Wellons's hash-prospector search): every input bit flips each output bit about half the
    time."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


# Element indices are uint32: an array with more elements (BERT-large's attention mask at a
# global batch of 1,024 has 4.3 billion) numbers its leading axes apart (see _hash_bits).
_INDEX_LIMIT = 2**32


def _flat_index(shape):
    """Each element's row-major index, from broadcast iotas (which XLA partitions like any
    other array, so every device computes its own part of a sharded mask)."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    return index


def _hash_bits(key, bit_width, shape):
    if bit_width not in (8, 16, 32):
        raise ValueError(f"the counter-hash dropout generator draws 8, 16 or 32 bits, "
                         f"not {bit_width}")
    shape = tuple(shape)
    split = 0  # leading axes [0, split) are numbered apart from the trailing ones
    while math.prod(shape[split:]) > _INDEX_LIMIT:
        split += 1
    if math.prod(shape[:split]) > _INDEX_LIMIT:
        raise ValueError(f"dropout mask of shape {shape} is too large for the counter-hash "
                         f"generator")
    # Two rounds, each keyed by one of the key's words: two calls whose first words differ
    # by less than the array's size see their index sets overlap after the first round, and
    # the second word makes them independent again.
    index = _flat_index(shape[split:])
    second = key[1]
    if split:
        lead = _flat_index(shape[:split]).reshape(shape[:split] + (1,) * (len(shape) - split))
        second = second ^ _mix32(lead + jnp.uint32(0x9E3779B9))
    bits = _mix32(_mix32(index ^ key[0]) ^ second)
    return bits if bit_width == 32 else lax.convert_element_type(
        bits >> (32 - bit_width), jnp.dtype(f"uint{bit_width}"))


def _hash_split(key, shape):
    return jax.random.key_data(jax.random.split(jax.random.wrap_key_data(key), shape))


def _hash_fold_in(key, data):
    return jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(key), data))


def _hash_seed(seed):
    return jax.random.key_data(jax.random.key(seed))


# Keys are two uint32 words; seeding, splitting and folding are threefry's (a few scalar
# hashes per step), only the bulk bits are the counter hash. Not a generator for anything
# but dropout masks: it is fast and well mixed, not cryptographic like threefry.
COUNTER_HASH = jax.extend.random.define_prng_impl(
    key_shape=(2,), seed=_hash_seed, split=_hash_split, random_bits=_hash_bits,
    fold_in=_hash_fold_in, name="counter_hash", tag="ch")


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
        # The mask is a float array (the scale or 0) that multiplies, made before the
        # concatenation so that XLA materialises it: the backward pass multiplies the incoming
        # gradient by it inside the transposes that feed the weight gradients, where XLA:CPU
        # runs a multiply at full speed but a compare and select on the random bits at a
        # tenth of it (measured: 15% of a fine-tuning step's op time on a 2-core Xeon).
        scale, zero = jnp.asarray(keep_scale, x.dtype), jnp.zeros((), x.dtype)
        halves_scale = [jnp.where(half >= drop_below, scale, zero)
                        for half in (words & 0xFFFF, words >> 16)]
        scale_or_zero = lax.slice_in_dim(jnp.concatenate(halves_scale, axis=axis), 0, n,
                                         axis=axis)
        return x * scale_or_zero


def make_dropout(rate: float, mask_bits: int, name: str | None = None) -> nn.Module:
    """The dropout module for `mask_bits` random bits per element (32: Flax's own, whose masks
    every run before this option drew)."""
    if mask_bits == 32:
        return nn.Dropout(rate, name=name)
    if mask_bits == 16:
        return HalfWordDropout(rate, name=name)
    raise ValueError(f"dropout_mask_bits {mask_bits}: expected one of {MASK_BITS}")
