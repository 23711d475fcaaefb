"""TF ops: BERT's masked-LM corruption of a batch of sequences, vectorised over the batch.

For each sequence of `length` tokens, n of them maskable (the A and B tokens: never [CLS],
[SEP], [PAD]), `min(P, max(1, round(length * mask_rate)), n)` of the maskable ones are chosen
uniformly. `length` counts [CLS] and the [SEP]s, as the original's `round(len(tokens) *
masked_lm_prob)` does: a full sequence of 512 gets 77 predictions, not round(509 * 0.15) = 76.
Each chosen one becomes
[MASK] with probability `mask_prob`, a random non-special token with `random_prob`, and stays
as it is otherwise. Outputs use the original feature names: positions sorted ascending and
padded with 0, `masked_lm_ids` the original tokens, `masked_lm_weights` 1.0 / 0.0.

Whole-word masking chooses words instead (a word = a word-start piece and the continuation
pieces after it): words are visited in random order and taken whole while the count stays
within the n_pred budget; a word that would overflow it is skipped, as in the original. The
[MASK] / random / keep decision is drawn once per *word* and applies to all its pieces (the
original draws it per piece, which can leave a word half [MASK], half visible; that lets the
model read part of the word it must predict, which is what whole-word masking is meant to stop).
"""

from __future__ import annotations

import tensorflow as tf


def num_predictions(length: tf.Tensor, num_maskable: tf.Tensor, max_predictions: int,
                    mask_rate: float) -> tf.Tensor:
    """min(P, max(1, round(length * mask_rate)), num_maskable), rounding half to even as
    Python's round; the original stops when it runs out of candidates, hence the last term."""
    n = tf.round(tf.cast(length, tf.float64) * mask_rate)
    wanted = tf.minimum(max_predictions, tf.maximum(1, tf.cast(n, tf.int32)))
    return tf.minimum(wanted, tf.cast(num_maskable, tf.int32))


def _sorted_positions(chosen_NL: tf.Tensor, max_predictions: int):
    """Ascending positions of the chosen tokens, [N, P] int32 padded with 0, and validity."""
    shape_NP = tf.stack([tf.shape(chosen_NL)[0], max_predictions])
    rank_NL = tf.cumsum(tf.cast(chosen_NL, tf.int32), axis=1) - 1
    where_M2 = tf.cast(tf.where(chosen_NL), tf.int32)
    slot_M2 = tf.stack([where_M2[:, 0], tf.gather_nd(rank_NL, where_M2)], axis=1)
    positions_NP = tf.scatter_nd(slot_M2, where_M2[:, 1], shape_NP)
    valid_NP = tf.scatter_nd(slot_M2, tf.ones_like(where_M2[:, 1]), shape_NP) > 0
    return positions_NP, valid_NP


def _choose_tokens(maskable_NL, n_pred_N, max_predictions, seed):
    """Positions [N, P] of n_pred uniformly chosen maskable tokens, ascending, and validity."""
    seq_len = tf.shape(maskable_NL)[1]
    keys_NL = tf.random.stateless_uniform(tf.shape(maskable_NL), seed, minval=0,
                                          maxval=tf.int32.max, dtype=tf.int32)
    # The P highest keys; the maskable tokens (keys >= 0) among them come first.
    _, top_NP = tf.math.top_k(tf.where(maskable_NL, keys_NL, -1), k=max_predictions,
                              sorted=True)
    valid_NP = tf.range(max_predictions)[None] < n_pred_N[:, None]
    positions_NP = tf.sort(tf.where(valid_NP, top_NP, seq_len), axis=1)
    return tf.where(valid_NP, positions_NP, 0), valid_NP


def _word_ids(ids_NL, maskable_NL, word_start_V):
    """Word number of each token within its row: a new word at every word-start piece and at
    every boundary of the maskable text, so a word never spans [CLS]/[SEP]/[PAD]."""
    prev_maskable_NL = tf.pad(maskable_NL[:, :-1], [[0, 0], [1, 0]])
    start_NL = tf.gather(word_start_V, ids_NL) | ~maskable_NL | ~prev_maskable_NL
    return tf.cumsum(tf.cast(start_NL, tf.int32), axis=1) - 1


def _rows_like(x_NK):
    return tf.broadcast_to(tf.range(tf.shape(x_NK)[0])[:, None], tf.shape(x_NK))


def _choose_words(ids_NL, maskable_NL, n_pred_N, max_predictions, word_start_V, seed):
    """Chosen tokens (whole words only) and each token's word number."""
    n_rows, seq_len = tf.shape(ids_NL)[0], ids_NL.shape[1]
    word_NL = _word_ids(ids_NL, maskable_NL, word_start_V)
    flat_word = tf.reshape(word_NL + tf.range(n_rows)[:, None] * seq_len, [-1])
    len_NW = tf.reshape(tf.math.unsorted_segment_sum(
        tf.reshape(tf.cast(maskable_NL, tf.int32), [-1]), flat_word, n_rows * seq_len),
        [n_rows, seq_len])
    is_word_NW = len_NW > 0
    # Distinct random keys (the word number in the low bits) give the order of visit.
    slot_bits = max(1, (seq_len - 1).bit_length())
    noise_NW = tf.random.stateless_uniform([n_rows, seq_len], seed, minval=0,
                                           maxval=1 << (31 - slot_bits), dtype=tf.int32)
    word_W = tf.range(seq_len)[None]
    keys_NW = tf.where(is_word_NW, noise_NW * (1 << slot_bits) + word_W, tf.int32.max)

    # The original visits words in key order and takes each one that still fits. Every word
    # before the first that overflows the budget fits: that prefix has at most n_pred <= P
    # words, so the P + 1 lowest keys contain it and the overflowing word. After it, only
    # words no longer than the remaining gap can fit, and each shrinks the gap: a few rounds.
    lowest_NK, top_NK = tf.math.top_k(-keys_NW, k=min(max_predictions + 1, seq_len))
    prefix_NK = tf.cumsum(tf.gather(len_NW, top_NK, batch_dims=1), axis=1) <= n_pred_N[:, None]
    prefix_N = tf.reduce_sum(tf.cast(prefix_NK, tf.int32), axis=1)
    overflow_N = -tf.gather(lowest_NK, tf.minimum(prefix_N, tf.shape(top_NK)[1] - 1)[:, None],
                            batch_dims=1)[:, 0]
    overflow_N = tf.where(prefix_N < tf.shape(top_NK)[1], overflow_N, tf.int32.max)
    taken_NW = is_word_NW & (keys_NW < overflow_N[:, None])
    gap_N = n_pred_N - tf.reduce_sum(tf.where(taken_NW, len_NW, 0), axis=1)

    def fill(taken_NW, gap_N, last_N):
        fits_NW = is_word_NW & (len_NW <= gap_N[:, None]) & (keys_NW > last_N[:, None])
        next_N = tf.reduce_min(tf.where(fits_NW, keys_NW, tf.int32.max), axis=1)
        found_N = next_N < tf.int32.max
        picked_NW = (keys_NW == next_N[:, None]) & found_N[:, None]
        gap_N -= tf.reduce_sum(tf.where(picked_NW, len_NW, 0), axis=1)
        return taken_NW | picked_NW, gap_N, next_N

    taken_NW, _, _ = tf.while_loop(lambda t, g, last: tf.reduce_any(last < tf.int32.max), fill,
                                   (taken_NW, gap_N, overflow_N))
    chosen_NL = tf.gather(taken_NW, word_NL, batch_dims=1) & maskable_NL
    return chosen_NL, word_NL


def mask_batch(ids_NL: tf.Tensor, maskable_NL: tf.Tensor, lengths_N: tf.Tensor,
               seed: tf.Tensor, *, max_predictions: int, mask_rate: float, mask_prob: float,
               random_prob: float, mask_id: int, random_ids: tf.Tensor,
               word_start: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    """Masks input_ids [N, L] of sequences `lengths_N` tokens long (specials included);
    returns input_ids and the masked_lm_* features ([N, P])."""
    choose_seed, action_seed, token_seed = tf.unstack(tf.random.split(seed, 3))
    n_pred_N = num_predictions(lengths_N, tf.reduce_sum(tf.cast(maskable_NL, tf.int32), axis=1),
                               max_predictions, mask_rate)
    if word_start is None:
        positions_NP, valid_NP = _choose_tokens(maskable_NL, n_pred_N, max_predictions,
                                                choose_seed)
        action_NP = tf.random.stateless_uniform(tf.shape(positions_NP), action_seed)
    else:
        chosen_NL, word_NL = _choose_words(ids_NL, maskable_NL, n_pred_N, max_predictions,
                                           word_start, choose_seed)
        positions_NP, valid_NP = _sorted_positions(chosen_NL, max_predictions)
        action_NW = tf.random.stateless_uniform(tf.shape(ids_NL), action_seed)
        action_NP = tf.gather(action_NW, tf.gather(word_NL, positions_NP, batch_dims=1),
                              batch_dims=1)
    original_NP = tf.gather(ids_NL, positions_NP, batch_dims=1)
    random_NP = tf.gather(random_ids, tf.random.stateless_uniform(
        tf.shape(positions_NP), token_seed, maxval=tf.shape(random_ids)[0], dtype=tf.int32))
    replaced_NP = tf.where(action_NP < mask_prob, mask_id,
                           tf.where(action_NP < mask_prob + random_prob, random_NP, original_NP))
    # Padding slots point at position 0 ([CLS]) and write back what is there.
    replaced_NP = tf.where(valid_NP, replaced_NP, original_NP)
    return {
        "input_ids": tf.tensor_scatter_nd_update(
            ids_NL, tf.stack([_rows_like(positions_NP), positions_NP], axis=-1), replaced_NP),
        "masked_lm_positions": positions_NP,
        "masked_lm_ids": tf.where(valid_NP, original_NP, 0),
        "masked_lm_weights": tf.cast(valid_NP, tf.float32),
    }
