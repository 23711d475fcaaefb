"""TF ops: a block of documents -> `[CLS] A [SEP] B [SEP]` sequences, as BERT's original recipe.

Works on a whole block of documents at once so tf.data runs it in its C++ threads. Where an
instance starts depends on where the previous one ended; those chains are followed for all
of a block's documents together by pointer doubling, so no op runs per instance or per token.

Instances are made per *part*: a document, or for a document longer than the pipeline's part
size (book-length ones) a run of its whole sentences of about that size (see
`examples.document_parts`), so that a block of the epoch holds many documents' worth of
parts and a batch is not drawn from a handful of books. Within a part, as google-research/bert
`create_instances_from_document` does per document:
- target length = max_num_tokens (max_seq_length - 3), or with probability `short_seq_prob` a
  uniform one in [2, max_num_tokens]; whole sentences fill a chunk until it reaches the target
  or the document ends;
- A = the first `a_end` sentences of the chunk, `a_end` uniform in [1, len(chunk) - 1] (1 for a
  one-sentence chunk); with probability 0.5, or always for a one-sentence chunk, B = sentences
  of a *different* document (uniform over the other documents, not parts) from a uniform
  start sentence on, filled to target - len(A), and the chunk's unused sentences are put
  back (the next instance starts after A); else B = the rest of the chunk;
- the pair is truncated to the target by dropping tokens from the longer side, each from the
  front or the back with probability 1/2 (drawn as a binomial count, which is the same
  distribution as the original's token-by-token coin flips).

Deliberate differences from the original. Two so that `short_seq_prob` means what its comment
says ("10% of the time"): the target is drawn per instance, not once per document (which made
the share of short examples depend on document lengths: in the original the one document in
ten with a short target yields several times the instances of the others, so about a fifth of
all instances are short), and a pair is truncated to its target, not to max_num_tokens (so a
short target gives a short sequence). Drawing per instance makes 5-11% fewer instances per
epoch than the original (seq 128 / 512, on the synthetic documents of
tests/test_pretraining_recipe.py, against its port of the original's loop; with
short_seq_prob = 0 the counts agree). And a chunk never
spans a part boundary, as it never spans a document: for documents longer than a part, about
half an instance more per part boundary.

Without NSP (`single_spans`) a document is cut into consecutive runs of tokens, each of the
target length (max_seq_length - 2, or short as above), ignoring sentence boundaries: nothing
of the document is wasted and no sentence-size rounding applies.

All randomness comes from stateless ops seeded by the caller (per block), keyed on positions
within the block, so the result depends only on the seed and the block's documents.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class PoolTensors:
    """The host's documents as TF constants (see document_pool.DocumentPool) and their parts."""
    tokens: tf.Tensor           # uint16/int32 [T]
    sentence_starts: tf.Tensor  # int64 [S+1]
    document_starts: tf.Tensor  # int64 [D+1]
    part_starts: tf.Tensor      # int64 [U+1]: sentence offset where each part starts, then S
    part_document: tf.Tensor    # int64 [U]: the document each part belongs to


@dataclasses.dataclass(frozen=True)
class Spans:
    """Token ranges [a0, a1) and [b0, b1) into the pool, per instance ([N] int64 each)."""
    a0: tf.Tensor
    a1: tf.Tensor
    b0: tf.Tensor
    b1: tf.Tensor
    next_sentence_labels: tf.Tensor  # int32 [N]: 1 when B is the random next


def _randint(u: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    """Uniform integer in [low, high] (inclusive, int64) from a float64 uniform u in [0, 1)."""
    n = high - low + 1
    return low + tf.minimum(tf.cast(tf.floor(u * tf.cast(n, tf.float64)), tf.int64), n - 1)


def _targets(u_short, u_length, max_tokens: int, short_seq_prob: float) -> tf.Tensor:
    max_tokens = tf.constant(max_tokens, tf.int64)
    short = _randint(u_length, tf.constant(2, tf.int64), max_tokens)
    return tf.where(u_short < short_seq_prob, short, max_tokens)


def _search(sorted_values: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """First index i with sorted_values[i] >= value, for each value."""
    return tf.searchsorted(sorted_values[None], values[None], side="left", out_type=tf.int64)[0]


def _block_rows(first: tf.Tensor, count: tf.Tensor):
    """Lays out `count[k]` consecutive items from `first[k]` for each k, end to end:
    returns (row [M], item [M], row_start [K]) with item = first[row] + index within the row."""
    row_start = tf.cumsum(count, exclusive=True)
    row = tf.repeat(tf.range(tf.shape(count, out_type=tf.int64)[0]), count)
    local = tf.range(tf.reduce_sum(count)) - tf.gather(row_start, row)
    return row, tf.gather(first, row) + local, row_start


def _chains(next_local: tf.Tensor, starts: tf.Tensor) -> tf.Tensor:
    """Indices (ascending) of the nodes on the chains start, next(start), next(next(start)), ...

    `next_local` [M] points forward or to M (the end). Pointer doubling: after round i the
    marked set holds the first 2^i nodes of every chain, so a block costs O(M log(chain
    length)) however long its longest document is.
    """
    m = tf.shape(next_local, out_type=tf.int64)[0]
    jump = tf.concat([next_local, [m]], axis=0)
    marked = tf.scatter_nd(starts[:, None], tf.ones_like(starts, tf.int32), [m + 1])

    def round_(marked, jump):
        reached = tf.math.unsorted_segment_max(marked, jump, m + 1)
        return tf.maximum(marked, reached), tf.gather(jump, jump)

    marked, _ = tf.while_loop(lambda _, jump: tf.reduce_any(tf.gather(jump, starts) < m),
                              round_, (marked, jump))
    return tf.where(marked[:-1] > 0)[:, 0]


def nsp_spans(part_ids: tf.Tensor, seed: tf.Tensor, pool: PoolTensors, *,
              max_num_tokens: int, short_seq_prob: float) -> tuple[Spans, tf.Tensor]:
    """Sentence pairs from the parts `part_ids` [K]; returns (spans, targets [N]).

    Every sentence of the block gets its draws (target, split, coin, other document) as if an
    instance started there; the instances are the chains of 'next start' from each part's
    first sentence. Draws are keyed on (seed, sentence number in the block).
    """
    sent, docs, parts = pool.sentence_starts, pool.document_starts, pool.part_starts
    part_ids = tf.cast(part_ids, tf.int64)
    first = tf.gather(parts, part_ids)
    row, cur, row_start = _block_rows(first, tf.gather(parts, part_ids + 1) - first)
    end = tf.gather(parts, tf.gather(part_ids, row) + 1)
    u = tf.random.stateless_uniform([tf.shape(cur)[0], 6], seed, dtype=tf.float64)

    target = _targets(u[:, 0], u[:, 1], max_num_tokens, short_seq_prob)
    chunk_end = tf.minimum(tf.maximum(_search(sent, tf.gather(sent, cur) + target), cur + 1), end)
    sentences = chunk_end - cur
    a_end = cur + _randint(u[:, 2], tf.ones_like(cur), tf.maximum(sentences - 1, 1))
    random_next = (sentences == 1) | (u[:, 3] < 0.5)
    nxt = tf.where(random_next, a_end, chunk_end)
    m = tf.shape(cur, out_type=tf.int64)[0]
    next_local = tf.where(nxt >= end, m, tf.range(m) + (nxt - cur))

    chosen = _chains(next_local, row_start)
    cur, a_end, chunk_end, target, random_next, u = (
        tf.gather(x, chosen) for x in (cur, a_end, chunk_end, target, random_next, u))
    doc = tf.gather(pool.part_document, tf.gather(part_ids, tf.gather(row, chosen)))
    a0, a1 = tf.gather(sent, cur), tf.gather(sent, a_end)

    # B from another document: draw among D - 1 and skip A's own, so it always differs.
    num_docs = tf.shape(docs, out_type=tf.int64)[0] - 1
    other = _randint(u[:, 4], tf.zeros_like(doc), tf.fill(tf.shape(doc), num_docs - 2))
    other += tf.cast(other >= doc, tf.int64)
    other_first, other_end = tf.gather(docs, other), tf.gather(docs, other + 1)
    b_first = _randint(u[:, 5], other_first, other_end - 1)
    rb0 = tf.gather(sent, b_first)
    wanted = tf.maximum(target - (a1 - a0), 1)
    b_end = tf.minimum(tf.maximum(_search(sent, rb0 + wanted), b_first + 1), other_end)

    spans = Spans(a0, a1,
                  tf.where(random_next, rb0, a1),
                  tf.where(random_next, tf.gather(sent, b_end), tf.gather(sent, chunk_end)),
                  tf.cast(random_next, tf.int32))
    return spans, target


def single_spans(part_ids: tf.Tensor, seed: tf.Tensor, pool: PoolTensors, *,
                 max_num_tokens: int, short_seq_prob: float) -> tuple[Spans, tf.Tensor]:
    """Consecutive token runs of each part (no B, for training without NSP).

    Instance k of a part starts where instance k - 1 ended, so starts are a cumulative
    sum of targets drawn per (seed, part slot, k); a part of n tokens has at most
    ceil(n / 2) instances (targets are at least 2), which bounds the draws.
    """
    sent, parts = pool.sentence_starts, pool.part_starts
    part_ids = tf.cast(part_ids, tf.int64)
    start = tf.gather(sent, tf.gather(parts, part_ids))
    end = tf.gather(sent, tf.gather(parts, part_ids + 1))
    row, _, row_start = _block_rows(tf.zeros_like(start), (end - start + 1) // 2)
    u = tf.random.stateless_uniform([tf.shape(row)[0], 2], seed, dtype=tf.float64)
    target = _targets(u[:, 0], u[:, 1], max_num_tokens, short_seq_prob)
    offset = tf.cumsum(target, exclusive=True)
    a0 = tf.gather(start, row) + offset - tf.gather(offset, tf.gather(row_start, row))
    keep = a0 < tf.gather(end, row)
    a0, row, target = (tf.boolean_mask(x, keep) for x in (a0, row, target))
    a1 = tf.minimum(a0 + target, tf.gather(end, row))
    zeros = tf.zeros_like(a0)
    spans = Spans(a0, a1, zeros, zeros, tf.zeros(tf.shape(a0), tf.int32))
    return spans, target


def truncate_pair(spans: Spans, target: tf.Tensor, seed: tf.Tensor) -> Spans:
    """Drops tokens from the longer of A and B (B on ties) until the pair fits the target."""
    la, lb = spans.a1 - spans.a0, spans.b1 - spans.b0
    excess = tf.maximum(la + lb - target, 0)
    uneven = tf.minimum(excess, tf.abs(la - lb))
    even = excess - uneven
    none = tf.zeros_like(uneven)
    drop_a = tf.where(la > lb, uneven, none) + even // 2
    drop_b = tf.where(la > lb, none, uneven) + (even + 1) // 2
    drops = tf.stack([drop_a, drop_b], axis=1)
    front = tf.random.stateless_binomial(
        tf.shape(drops), seed, counts=tf.cast(drops, tf.float32), probs=0.5, output_dtype=tf.int64)
    return dataclasses.replace(
        spans,
        a0=spans.a0 + front[:, 0], a1=spans.a1 - (drop_a - front[:, 0]),
        b0=spans.b0 + front[:, 1], b1=spans.b1 - (drop_b - front[:, 1]))


def assemble(tokens: tf.Tensor, spans: Spans, *, seq_len: int, cls_id: int, sep_id: int,
             pad_id: int, pair: bool) -> dict[str, tf.Tensor]:
    """`[CLS] A [SEP] (B [SEP])` padded to seq_len: input_ids, input_mask, segment_ids
    (int32 [N, L]) and `maskable` (bool [N, L], the A and B tokens)."""
    la = (spans.a1 - spans.a0)[:, None]
    lb = (spans.b1 - spans.b0)[:, None]
    pos = tf.range(seq_len, dtype=tf.int64)[None]
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos < la + 2 + lb)
    source = tf.where(in_a, spans.a0[:, None] + pos - 1,
                      tf.where(in_b, spans.b0[:, None] + pos - la - 2, tf.zeros_like(pos)))
    text = tf.cast(tf.gather(tokens, source), tf.int32)
    length = la + 2 + (lb + 1 if pair else 0)
    is_sep = (pos == la + 1) | (pos == length - 1)
    special = tf.where(pos == 0, cls_id, tf.where(is_sep, sep_id, pad_id))
    input_mask = pos < length
    return {
        "input_ids": tf.where(in_a | in_b, text, special),
        "input_mask": tf.cast(input_mask, tf.int32),
        "segment_ids": tf.cast((pos >= la + 2) & input_mask, tf.int32),
        "maskable": in_a | in_b,
    }
