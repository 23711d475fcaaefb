"""One block of a host's documents -> shuffled, masked BERT examples, as one TF function.

`block_function(recipe, ...)` is traced once per recipe and reused by every pipeline built
with it (training and evaluation, every test): the documents and the seed are arguments,
not captured constants. A call does everything for one block with TF ops, so tf.data runs
blocks in parallel in its C++ threads:

  (epoch, block, its slots in the epoch's order of parts) -> the block's parts of documents
  -> pairs (`pairs`) -> truncation -> `[CLS] A [SEP] B [SEP]` -> masks (`masking`)
  -> a seeded shuffle of the block's examples -> drop the first `skip` (to resume).

The unit an epoch shuffles is a *part* of a document (`document_parts`): the document itself,
or, for one longer than the part size, a run of its whole sentences of about that size.
`epoch_blocks` cuts each epoch's order of parts into blocks of about `block_tokens` tokens.
A block's examples are shuffled together, so parts, not whole documents, are what a batch
mixes: with the default 2^19-token blocks, documents of 100k tokens (books; prepare splits
longer ones) would put only about five documents in a block, and every batch would come from
those five. Every random draw is a stateless op seeded by (seed, host, epoch, block), so a
block's examples are a function of those numbers alone.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import tensorflow as tf

from bertjax.data import masking, packing, pairs

_SEED_SALT = 0x0BE27

# A block holds at least this many parts (so many documents' worth, when documents are long) ...
PARTS_PER_BLOCK = 64
# ... unless that would make a part shorter than this many full sequences: every part
# boundary cuts a chunk short, like a document's end, about half an instance per boundary.
MIN_PART_SEQUENCES = 32


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How examples are made from documents (BERT's defaults)."""
    max_seq_length: int
    max_predictions_per_seq: int
    mask_rate: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1
    whole_word_masking: bool = False
    nsp: bool = True
    short_seq_prob: float = 0.1
    examples_per_row: int = 1  # > 1: rows packed with up to this many examples (packing.py)

    @property
    def max_num_tokens(self) -> int:
        """Text tokens of a full sequence: L minus [CLS] and one or two [SEP]."""
        return self.max_seq_length - (3 if self.nsp else 2)

    def check(self) -> None:
        length, preds = self.max_seq_length, self.max_predictions_per_seq
        least = 5 if self.nsp else 4
        if length < least:
            raise ValueError(
                f"max_seq_length={length} is too small: need at least {least} for "
                + ("[CLS] A [SEP] B [SEP]" if self.nsp else "[CLS] A [SEP]")
                + " with a target of at least 2 text tokens")
        for name in ("mask_rate", "mask_prob", "random_prob", "short_seq_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} must be in [0, 1]")
        if self.mask_rate == 0:
            raise ValueError("mask_rate=0 would give nothing to predict; BERT uses 0.15")
        if self.mask_prob + self.random_prob > 1.0:
            raise ValueError(f"mask_prob={self.mask_prob} + random_prob={self.random_prob} > 1: "
                             "the rest is the share kept unchanged, so it cannot be negative")
        needed = int(round(self.mask_rate * length))
        if preds < needed:
            raise ValueError(
                f"max_predictions_per_seq={preds} is too small for max_seq_length={length} at "
                f"mask_rate={self.mask_rate}: a full sequence has round({self.mask_rate} * "
                f"{length}) = {needed} to predict; set max_predictions_per_seq >= {needed}")
        if preds > length:
            raise ValueError(f"max_predictions_per_seq={preds} > max_seq_length={length}")
        if self.examples_per_row < 1:
            raise ValueError(f"examples_per_row={self.examples_per_row}: expected 1 (one "
                             "example a row) or more (packed rows)")


def part_tokens(block_tokens: int, max_seq_length: int) -> int:
    """The part size for blocks of `block_tokens`: PARTS_PER_BLOCK parts per block, but at
    least MIN_PART_SEQUENCES sequences per part."""
    return max(block_tokens // PARTS_PER_BLOCK, MIN_PART_SEQUENCES * max_seq_length)


def document_parts(sentence_starts: np.ndarray, document_starts: np.ndarray,
                   size: int) -> tuple[np.ndarray, np.ndarray]:
    """(part_starts [U+1], part_document [U]): each document cut at the first sentence that
    starts at or after every multiple of `size` tokens into it. A document of at most `size`
    tokens is one part; a longer one has parts of at least `size` tokens (the last excepted)."""
    num_sentences = len(sentence_starts) - 1
    sentence_document = np.repeat(np.arange(len(document_starts) - 1),
                                  np.diff(document_starts))
    document_first_token = sentence_starts[document_starts[:-1]]
    window = (sentence_starts[:-1] - document_first_token[sentence_document]) // size
    starts = np.ones(num_sentences, bool)
    starts[1:] = ((sentence_document[1:] != sentence_document[:-1])
                  | (window[1:] != window[:-1]))
    first = np.flatnonzero(starts)
    return (np.append(first, num_sentences).astype(np.int64),
            sentence_document[first].astype(np.int64))


def _seed(seed: tf.Tensor, *keys: tf.Tensor) -> tf.Tensor:
    out = tf.stack([seed, tf.constant(_SEED_SALT, tf.int64)])
    for key in keys:
        out = tf.random.fold_in(out, tf.cast(key, tf.int64))
    return out


def _epoch_order(epoch, seed, host, num_parts, slots):
    """Parts at `slots` of this epoch's seeded permutation of the host's parts."""
    return tf.random.experimental.index_shuffle(slots, _seed(seed, host, epoch), num_parts - 1)


@tf.function(input_signature=[tf.TensorSpec([], tf.int64)] * 4 + [tf.TensorSpec([None], tf.int64)],
             autograph=False)
def epoch_blocks(epoch, seed, host, block_tokens, part_tokens):
    """[blocks, 2] int64: (first, end) slots of the epoch's order of parts that form each block.

    A block takes parts in order while they start within its `block_tokens` window, so it
    holds about `block_tokens` tokens (plus at most one part) whatever the parts' sizes.
    """
    num_parts = tf.shape(part_tokens, out_type=tf.int64)[0]
    sizes = tf.gather(part_tokens, _epoch_order(epoch, seed, host, num_parts,
                                                tf.range(num_parts)))
    window = tf.cumsum(sizes, exclusive=True) // block_tokens
    first = tf.where(tf.concat([[True], window[1:] != window[:-1]], axis=0))[:, 0]
    return tf.stack([first, tf.concat([first[1:], [num_parts]], axis=0)], axis=1)


@functools.lru_cache(maxsize=None)
def block_function(recipe: Recipe, *, cls_id: int, sep_id: int, pad_id: int, mask_id: int,
                   token_dtype: tf.DType):
    """tf.function(epoch, block, first, end, skip, seed, host, tokens, sentence_starts,
    document_starts, part_starts, part_document, random_ids, word_start) -> dict of the
    examples of the block made of slots [first, end) of the epoch's order of parts, [N, ...]
    each, without the first `skip`, plus `_epoch`, `_block` and `_example` (the example's
    index in the block)."""
    spans_fn = pairs.nsp_spans if recipe.nsp else pairs.single_spans
    scalar = tf.TensorSpec([], tf.int64)
    offsets = tf.TensorSpec([None], tf.int64)
    signature = [scalar] * 7 + [
        tf.TensorSpec([None], token_dtype), offsets, offsets, offsets, offsets,
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.bool)]

    @tf.function(input_signature=signature, autograph=False)
    def make(epoch, block, first, end, skip, seed, host, tokens, sentence_starts,
             document_starts, part_starts, part_document, random_ids, word_start):
        pool = pairs.PoolTensors(tokens, sentence_starts, document_starts, part_starts,
                                 part_document)
        num_parts = tf.shape(part_document, out_type=tf.int64)[0]
        part_ids = _epoch_order(epoch, seed, host, num_parts, tf.range(first, end))
        block_seed = _seed(seed, host, epoch, block, 1)
        pair_seed, trunc_seed, mask_seed, order_seed = tf.unstack(tf.random.split(block_seed, 4))
        spans, target = spans_fn(part_ids, pair_seed, pool,
                                 max_num_tokens=recipe.max_num_tokens,
                                 short_seq_prob=recipe.short_seq_prob)
        if recipe.nsp:
            spans = pairs.truncate_pair(spans, target, trunc_seed)
        ex = pairs.assemble(tokens, spans, seq_len=recipe.max_seq_length, cls_id=cls_id,
                            sep_id=sep_id, pad_id=pad_id, pair=recipe.nsp)
        ex.update(masking.mask_batch(
            ex["input_ids"], ex.pop("maskable"), tf.reduce_sum(ex["input_mask"], axis=1),
            mask_seed,
            max_predictions=recipe.max_predictions_per_seq, mask_rate=recipe.mask_rate,
            mask_prob=recipe.mask_prob, random_prob=recipe.random_prob, mask_id=mask_id,
            random_ids=random_ids, word_start=word_start if recipe.whole_word_masking else None))
        ex["next_sentence_labels"] = spans.next_sentence_labels
        count = tf.shape(spans.a0)[0]
        order = tf.argsort(tf.random.stateless_uniform([count], order_seed), stable=True)
        ex = {k: tf.gather(v, order) for k, v in ex.items()}
        if recipe.examples_per_row > 1:  # then rows, not examples, are what a block counts
            ex = packing.pack(ex, seq_len=recipe.max_seq_length,
                              max_predictions=recipe.max_predictions_per_seq,
                              examples_per_row=recipe.examples_per_row, pad_id=pad_id,
                              seed=_seed(seed, host, epoch, block, 2))
            count = tf.shape(ex["input_ids"])[0]
        kept = tf.range(tf.minimum(tf.cast(skip, tf.int32), count), count)
        ex = {k: tf.gather(v, kept) for k, v in ex.items()}  # a slice would log TF warnings
        ex["_epoch"] = tf.fill(tf.shape(kept), epoch)
        ex["_block"] = tf.fill(tf.shape(kept), block)
        ex["_example"] = kept
        return ex

    return make
