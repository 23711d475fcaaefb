"""Who attends to whom as segment ids, and TPU's splash-attention kernel behind
`BertConfig.attention='splash'`.

XLA's attention (`jax.nn.dot_product_attention` and the explicit path with dropout on the
probabilities) computes the [B, H, L, L] scores and keeps the probabilities for the backward
pass. Pallas's splash kernel computes attention a block at a time and keeps only the output
and a log-sum-exp per query. It takes its mask as segment ids (a query sees the keys with its
own id) instead of a boolean array, and it has no dropout on the probabilities.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.models import meshes

ATTENTIONS = ("xla", "splash")

# The kernel's blocks span 128 positions: with segment ids, its backward needs queries and
# keys in whole blocks (128 lanes on a TPU core). Other lengths run XLA's attention.
BLOCK = 128


@flax.struct.dataclass
class SegmentMask:
    """Query i of row b attends to key j iff `q_BQ[b, i] == kv_BL[b, j]`.

    Every query must see at least one key: splash's backward is wrong for a query that sees
    none (its log-sum-exp rounds to the mask value, so the backward gives every masked key
    probability 1), so the constructors below never make such a row.
    """

    q_BQ: jax.Array
    kv_BL: jax.Array

    def rows(self, positions_BP) -> "SegmentMask":
        """The queries at `positions_BP` only (the sparse last layer); keys unchanged."""
        q_BP = jnp.take_along_axis(self.q_BQ, positions_BP.astype(jnp.int32), axis=1)
        return SegmentMask(q_BP, self.kv_BL)

    def dense(self) -> jax.Array:
        """The same mask as XLA's attention takes it: [B, 1, Q, L] bool."""
        return (self.q_BQ[:, :, None] == self.kv_BL[:, None, :])[:, None]


def padding_segments(input_mask_BL) -> SegmentMask:
    """Every query sees the real tokens of its row: the padding mask [B, 1, 1, L], padding
    queries included. A row with no real token (a batch's filler) sees all of its positions
    instead of none; XLA's attention spreads such a row uniformly over them, so only those
    rows' outputs differ, and no loss reads them."""
    real_BL = input_mask_BL.astype(bool)
    empty_B1 = ~jnp.any(real_BL, axis=1, keepdims=True)
    kv_BL = (real_BL | empty_B1).astype(jnp.int32)
    return SegmentMask(jnp.ones_like(kv_BL), kv_BL)


def packed_segments(example_ids_BL) -> SegmentMask:
    """Packed rows (`example_ids` 1, 2, ... per token, 0 for padding): each token sees only
    its own example's tokens, as `bert.Packing.attention_mask` does. Padding tokens see each
    other; under XLA's mask they see nothing (a uniform average), so only the padding
    positions' outputs differ, which no loss reads."""
    ids_BL = example_ids_BL.astype(jnp.int32)
    return SegmentMask(ids_BL, ids_BL)


def splash_fits(q_len: int, kv_len: int) -> bool:
    """Whether the kernel takes these lengths: whole blocks of queries and of keys. The sparse
    last layer's few gathered queries (21 of 128 in pretraining) do not; padding them to 128
    would give back what that layer saves, and their scores are only [B, H, P, L]."""
    return q_len % BLOCK == 0 and kv_len % BLOCK == 0


def _kernel(heads: int, q_len: int, kv_len: int, interpret: bool):
    # Imported here: Pallas's TPU modules are not needed by runs that do not use the kernel.
    from jax.experimental.pallas.ops.tpu.splash_attention import (splash_attention_kernel,
                                                                  splash_attention_mask)
    # No static mask (FullMask): padding and packing are the segment ids. Made anew in each
    # trace, not cached: the kernel holds its block tables as arrays of the trace it is made
    # in.
    mask = splash_attention_mask.MultiHeadMask(
        [splash_attention_mask.FullMask((q_len, kv_len))] * heads)
    return splash_attention_kernel.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                                   interpret=interpret)


def _per_shard(q_BHQK, k_BHLK, v_BHLK, q_ids_BQ, kv_ids_BL, interpret: bool):
    """The kernel over the rows and heads it is given (one device's shard): it takes one
    example, [heads, length, head_dim], at a time."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel
    kernel = _kernel(q_BHQK.shape[1], q_BHQK.shape[2], k_BHLK.shape[2], interpret)
    return jax.vmap(lambda q, k, v, qi, ki: kernel(
        q, k, v, segment_ids=splash_attention_kernel.SegmentIds(qi, ki)))(
        q_BHQK, k_BHLK, v_BHLK, q_ids_BQ, kv_ids_BL)


def splash_attention(q_BQHK, k_BLHK, v_BLHK, segments: SegmentMask):
    """softmax(q k^T / sqrt(K)) v with the segment mask: [B, Q, H, K] -> [B, Q, H, K].

    The kernel is a Pallas call, which XLA cannot split across devices: it runs inside a
    `shard_map` over the mesh the queries are laid out on (models/meshes.py), rows split as
    the logical axis rules (`nn.logical_axis_rules`, which the trainer traces its steps in)
    split 'batch' and heads as they split 'heads'. Without a mesh it runs on the whole batch (one device). It
    runs compiled on TPUs and in Pallas's interpreter elsewhere (slowly: for tests on CPUs).
    """
    scale = 1.0 / math.sqrt(q_BQHK.shape[-1])
    # The kernel does not scale the scores; scaling the queries is the same product.
    q_BHQK = (q_BQHK * jnp.asarray(scale, q_BQHK.dtype)).transpose(0, 2, 1, 3)
    k_BHLK, v_BHLK = k_BLHK.transpose(0, 2, 1, 3), v_BLHK.transpose(0, 2, 1, 3)
    mesh = meshes.mesh_of(q_BQHK)
    device = None if mesh.empty else mesh.abstract_device  # None: a mesh built by hand
    platform = jax.default_backend() if device is None else device.platform
    run = functools.partial(_per_shard, interpret=platform != "tpu")
    args = (q_BHQK, k_BHLK, v_BHLK, segments.q_BQ, segments.kv_BL)
    if mesh.empty:
        out_BHQK = run(*args)
    else:
        # Mesh axes the rules do not name for these dimensions see the whole of them (and
        # compute it redundantly, as XLA would).
        batch, heads = nn.logical_to_mesh_axes(("batch", "heads"))
        spec_BHXK = jax.sharding.PartitionSpec(batch, heads, None, None)
        spec_BX = jax.sharding.PartitionSpec(batch, None)
        out_BHQK = jax.shard_map(run, mesh=mesh, in_specs=(spec_BHXK,) * 3 + (spec_BX,) * 2,
                                 out_specs=spec_BHXK, check_vma=False)(*args)
    return out_BHQK.transpose(0, 2, 1, 3)
