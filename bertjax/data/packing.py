"""Several pretraining examples per row, so that short examples do not fill rows with padding:
the TensorFlow half of the batching contract (bertjax/batching.py), run inside tf.data.

`pack(ex, ...)` takes a block's examples (`examples.block_function`'s dict, [N, ...] each, as
`pairs.assemble` and `masking` made them) and returns rows of up to `examples_per_row` (K) of
them, placed by first-fit decreasing (longest first, each into the first row with room), the
rows then shuffled by a seeded permutation. The rows carry the contract's packed arrays
(`batching.PACKED_ARRAYS`: `position_ids`, `example_ids`, `cls_positions`,
`example_weights`), so every example keeps what it had alone: its tokens, segment ids and
masks, its positions and attention, and its own next-sentence label (`next_sentence_labels`
[K], a per-example target). Its predictions sit in the row's `max_predictions + K` slots,
after the predictions of the examples before it (a row's examples never need more: see
`pack`). So a packed batch gives every example the loss and gradient it would have alone in
a padded row.
"""

from __future__ import annotations

import tensorflow as tf

from bertjax.batching import EXAMPLE_WEIGHTS


def first_fit_decreasing(lengths: tf.Tensor, capacity: int, max_per_row: int):
    """(row, offset, slot) [N] int32 of each example, and the number of rows: longest first,
    each into the first row with `capacity - fill >= length` and fewer than `max_per_row`."""
    n = tf.shape(lengths)[0]
    order = tf.argsort(-lengths, stable=True)

    def body(i, fill, count, row, offset, slot):
        e = order[i]
        fits = (fill + lengths[e] <= capacity) & (count < max_per_row)
        r = tf.cast(tf.argmax(tf.cast(fits, tf.int32)), tf.int32)  # an empty row always fits
        at = [[e]]
        row = tf.tensor_scatter_nd_update(row, at, [r])
        offset = tf.tensor_scatter_nd_update(offset, at, [fill[r]])
        slot = tf.tensor_scatter_nd_update(slot, at, [count[r]])
        fill = tf.tensor_scatter_nd_add(fill, [[r]], [lengths[e]])
        count = tf.tensor_scatter_nd_add(count, [[r]], [1])
        return i + 1, fill, count, row, offset, slot

    zeros = tf.zeros([n], tf.int32)
    _, fill, _, row, offset, slot = tf.while_loop(
        lambda i, *_: i < n, body, (tf.constant(0), zeros, zeros, zeros, zeros, zeros))
    return row, offset, slot, tf.reduce_sum(tf.cast(fill > 0, tf.int32))


def pack(ex: dict, *, seq_len: int, max_predictions: int, examples_per_row: int, pad_id: int,
         seed: tf.Tensor) -> dict:
    """The examples of `ex` packed into rows (see the module docstring); `seed` shuffles the
    rows."""
    k_max, p = examples_per_row, max_predictions
    mask = tf.cast(ex["input_mask"], tf.bool)
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    row, offset, slot, num_rows = first_fit_decreasing(lengths, seq_len, k_max)
    # Rows come out longest first: a seeded permutation spreads them.
    rank = tf.argsort(tf.argsort(tf.random.stateless_uniform([num_rows], seed)))
    row = tf.gather(rank, row)

    token = tf.cast(tf.where(mask), tf.int32)  # [T, 2]: (example, position in it)
    e, t = token[:, 0], token[:, 1]
    at = tf.stack([tf.gather(row, e), tf.gather(offset, e) + t], axis=1)
    shape = [num_rows, seq_len]

    def scatter(values, fill, dtype):
        return tf.tensor_scatter_nd_update(tf.fill(shape, tf.cast(fill, dtype)), at,
                                           tf.cast(values, dtype))

    ids_dtype = ex["input_ids"].dtype
    out = {
        "input_ids": scatter(tf.gather_nd(ex["input_ids"], token), pad_id, ids_dtype),
        "input_mask": scatter(tf.ones_like(e), 0, ex["input_mask"].dtype),
        "segment_ids": scatter(tf.gather_nd(ex["segment_ids"], token), 0,
                               ex["segment_ids"].dtype),
        "position_ids": scatter(t, 0, tf.int32),
        "example_ids": scatter(tf.gather(slot, e) + 1, 0, tf.int32),
    }
    # Predictions: each example's, in the order of its slot, one after another. An example
    # of n tokens has at most max(1, round(rate * n)) <= rate * n + 1 of them and the check
    # P >= round(rate * L) holds, so P + K slots hold a row's.
    weights = ex["masked_lm_weights"]
    real = weights > 0
    count = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
    per_slot = tf.tensor_scatter_nd_update(tf.zeros([num_rows, k_max], tf.int32),
                                           tf.stack([row, slot], axis=1), count)
    first = tf.gather_nd(tf.cumsum(per_slot, axis=1, exclusive=True),
                         tf.stack([row, slot], axis=1))
    kept = tf.cast(tf.where(real), tf.int32)  # [M, 2]: (example, prediction slot)
    nth = tf.gather_nd(tf.cumsum(tf.cast(real, tf.int32), axis=1) - 1, kept)
    pred_at = tf.stack([tf.gather(row, kept[:, 0]), tf.gather(first, kept[:, 0]) + nth], axis=1)
    shifted = tf.cast(ex["masked_lm_positions"], tf.int32) + offset[:, None]

    def scatter_predictions(values, dtype):
        return tf.tensor_scatter_nd_update(tf.zeros([num_rows, p + k_max], dtype), pred_at,
                                           tf.cast(tf.gather_nd(values, kept), dtype))

    out["masked_lm_positions"] = scatter_predictions(shifted,
                                                     ex["masked_lm_positions"].dtype)
    out["masked_lm_ids"] = scatter_predictions(ex["masked_lm_ids"], ex["masked_lm_ids"].dtype)
    out["masked_lm_weights"] = scatter_predictions(weights, weights.dtype)
    # Next-sentence prediction: one label per example, at its slot.
    slot_at = tf.stack([row, slot], axis=1)

    def scatter_slots(values, dtype):
        return tf.tensor_scatter_nd_update(tf.zeros([num_rows, k_max], dtype), slot_at,
                                           tf.cast(values, dtype))

    labels = ex["next_sentence_labels"]
    out["next_sentence_labels"] = scatter_slots(labels, labels.dtype)
    out[EXAMPLE_WEIGHTS] = scatter_slots(tf.ones_like(lengths), tf.float32)
    out["cls_positions"] = scatter_slots(offset, tf.int32)
    return out
