"""The pretraining input pipeline: tokenized document shards -> masked BERT batches, per host.

    it = pretraining_dataset(shard_dir, vocab=Vocab.from_tokenizer(tok), max_seq_length=128,
                             max_predictions_per_seq=20, global_batch_size=256, seed=0,
                             process_index=jax.process_index(), process_count=jax.process_count())
    batch = next(it)             # dict of numpy arrays, this host's global_batch_size / hosts rows
    saved = it.position()        # small dict of ints: save it with the checkpoint
    it = pretraining_dataset(..., start_position=saved)   # continues with the very next batch

A position belongs to one host (each host walks its own documents): with several hosts,
save every host's position (e.g. gathered as a [process_count, 3] int array) and give each
host its own back. It is only valid for the same shards, hosts, seed and `shuffle_tokens`.

Each host reads shard files i, i + n, ... and keeps their documents in memory
(`document_pool`), because the random "next sentence" must come from *any other* document:
a second, independently shuffled stream could hand back the same document (the known bug of
other ports), and random access into memory is both exact and fast. The limit is host
memory: 2 bytes per token (4 for vocabularies over 65,536 ids), about 2 GB per billion tokens.

Every epoch visits the host's documents in a new seeded permutation (`index_shuffle`), in
blocks of about `shuffle_tokens` tokens (`examples.epoch_blocks`); documents longer than
a part (1/64 of a block, but at least 32 sequences) are visited in parts
(`examples.document_parts`), so a block mixes dozens of documents, books included. One tf.data map
call turns a whole block into examples with TF ops (`pairs`, then `masking`) and shuffles
them: that is the mixing window, in place of a shuffle buffer whose contents a checkpoint
could not hold cheaply. Every random draw is a stateless op seeded by (seed, host, epoch,
block), so the stream is the same whatever `num_parallel_calls`, and a position
(epoch, block, examples of the block already emitted) restores it by rebuilding one block.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import numpy as np
import tensorflow as tf

from bertjax.data import FEATURES, document_pool, examples, shards, tensorflow  # noqa: F401
from bertjax.data.tokenizers import SPECIAL_TOKENS
from bertjax.data.examples import Recipe


tensorflow()  # before any TF op: keeps TF off the accelerators



@dataclasses.dataclass(frozen=True)
class Vocab:
    """What the pipeline needs of a tokenizer: its size, special ids and word starts."""
    size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    word_start: np.ndarray | None = None  # bool [size], for whole-word masking

    @classmethod
    def from_tokenizer(cls, tokenizer) -> Vocab:
        ids = tokenizer.special_ids()
        return cls(tokenizer.vocab_size, ids["[PAD]"], ids["[UNK]"], ids["[CLS]"],
                   ids["[SEP]"], ids["[MASK]"], np.asarray(tokenizer.word_start_table(), bool))

    def special_ids(self) -> dict[str, int]:
        return dict(zip(SPECIAL_TOKENS,
                        (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)))

    def random_ids(self) -> np.ndarray:
        """The ids a 'random token' replacement draws from: every id but the special ones."""
        special = list(self.special_ids().values())
        return np.setdiff1d(np.arange(self.size), special).astype(np.int32)

    def check(self, whole_word_masking: bool) -> None:
        ids = self.special_ids()
        bad = {k: v for k, v in ids.items() if not 0 <= v < self.size}
        if bad:
            raise ValueError(f"special token ids {bad} outside the vocabulary [0, {self.size})")
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"special token ids must differ, got {ids}")
        shape = None if self.word_start is None else np.shape(self.word_start)
        if whole_word_masking and shape != (self.size,):
            raise ValueError("whole_word_masking needs Vocab.word_start, a bool table of shape "
                             f"[{self.size}], got {shape}")


def _position(epoch: int, block: int, example: int) -> dict[str, int]:
    return {"epoch": int(epoch), "block": int(block), "example": int(example)}


class PretrainingIterator:
    """Iterates numpy batches (dicts keyed by FEATURES); `position()` says where it stands."""

    def __init__(self, dataset: tf.data.Dataset, start: Mapping[str, int], batch_size: int):
        self.batch_size = batch_size
        self._position = _position(start["epoch"], start["block"], start["example"])
        self._iterator = iter(dataset)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self._position = _position(batch["_epoch"][-1], batch["_block"][-1],
                                   batch["_example"][-1] + 1)
        return {k: v.numpy() for k, v in batch.items() if not k.startswith("_")}

    def position(self) -> dict[str, int]:
        """After the last batch returned: restore with `start_position=` to continue from it."""
        return dict(self._position)


class _Pipeline:
    """The host's documents and how to turn a stream of blocks into batches."""

    def __init__(self, pool: document_pool.DocumentPool, recipe: Recipe, vocab: Vocab, *,
                 seed: int, process_index: int, shuffle_tokens: int):
        self._make = examples.block_function(
            recipe, cls_id=vocab.cls_id, sep_id=vocab.sep_id, pad_id=vocab.pad_id,
            mask_id=vocab.mask_id, token_dtype=tf.as_dtype(pool.tokens.dtype))
        word_start = vocab.word_start if recipe.whole_word_masking else np.zeros(1, bool)
        self._keys = [tf.constant(x, tf.int64) for x in (seed, process_index, shuffle_tokens)]
        part_starts, part_document = examples.document_parts(
            pool.sentence_starts, pool.document_starts,
            examples.part_tokens(shuffle_tokens, recipe.max_seq_length))
        self._pool = [tf.constant(pool.tokens), tf.constant(pool.sentence_starts),
                      tf.constant(pool.document_starts), tf.constant(part_starts),
                      tf.constant(part_document), tf.constant(vocab.random_ids()),
                      tf.constant(np.asarray(word_start, bool))]
        self._part_tokens = tf.constant(np.diff(pool.sentence_starts[part_starts]))

    def blocks_in_epoch(self, epoch: int) -> int:
        return int(examples.epoch_blocks(tf.constant(epoch, tf.int64), *self._keys,
                                         self._part_tokens).shape[0])

    def blocks(self, epochs: tf.data.Dataset) -> tf.data.Dataset:
        """(epoch, block, first slot, end slot) of every block of `epochs`, in order."""
        def one_epoch(epoch):
            bounds = examples.epoch_blocks(epoch, *self._keys, self._part_tokens)
            count = tf.shape(bounds, out_type=tf.int64)[0]
            return tf.data.Dataset.from_tensor_slices(
                (tf.fill([count], epoch), tf.range(count), bounds[:, 0], bounds[:, 1]))
        return epochs.flat_map(one_epoch)

    def batches(self, blocks: tf.data.Dataset, batch_size: int, num_parallel_calls,
                skip_first: int = 0) -> tf.data.Dataset:
        seed, host, _ = self._keys

        def make(index, block):
            skip = tf.where(index == 0, tf.constant(skip_first, tf.int64), 0)
            return self._make(*block, skip, seed, host, *self._pool)

        ds = blocks.enumerate().map(make, num_parallel_calls=num_parallel_calls,
                                    deterministic=True)
        return ds.rebatch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _load(shard_dir, recipe, vocab, *, process_index, process_count, heldout_fraction,
          heldout, max_document_tokens):
    recipe.check()
    vocab.check(recipe.whole_word_masking)
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction} must be in [0, 1)")
    paths = document_pool.host_shard_paths(shard_dir, process_index, process_count)
    pool = document_pool.load_pool(
        paths, vocab_size=vocab.size, max_document_tokens=max_document_tokens,
        heldout_fraction=heldout_fraction, heldout=heldout,
        expected_counts=shards.read_manifest(shard_dir).get("shard_counts"))
    least = 2 if recipe.nsp else 1
    if pool.num_documents < least:
        which = "held-out" if heldout else "training"
        raise ValueError(
            f"{shard_dir}: host {process_index} of {process_count} has {pool.num_documents} "
            f"{which} documents (files {[p.rsplit('/', 1)[-1] for p in paths][:4]}, "
            f"heldout_fraction={heldout_fraction}); "
            + ("next-sentence prediction needs at least two: the random next sentence comes "
               "from another document" if recipe.nsp else "need at least one"))
    return pool


def _host_batch(global_batch_size: int, process_count: int) -> int:
    if global_batch_size < process_count or global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} does not divide evenly over "
                         f"process_count={process_count} hosts")
    return global_batch_size // process_count


def pretraining_dataset(shard_dir: str, *, vocab: Vocab, max_seq_length: int,
                        max_predictions_per_seq: int, global_batch_size: int, seed: int,
                        mask_rate: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1,
                        whole_word_masking: bool = False, nsp: bool = True,
                        short_seq_prob: float = 0.1, shuffle_tokens: int = 1 << 19,
                        examples_per_row: int = 1,
                        heldout_fraction: float = 0.0, process_index: int = 0,
                        process_count: int = 1, num_parallel_calls: int = tf.data.AUTOTUNE,
                        start_position: Mapping[str, int] | None = None,
                        max_document_tokens: int = 1_000_000) -> PretrainingIterator:
    """Endless training batches of this host's share of `shard_dir`, from `start_position`.

    Trains on the documents not held out by `heldout_fraction` (see `eval_dataset`).
    Examples are made and shuffled in blocks of documents of about `shuffle_tokens` tokens:
    that is the window within which they mix, and what one parallel call holds in memory
    (roughly 100 bytes per token while it works).
    """
    recipe = Recipe(max_seq_length, max_predictions_per_seq, mask_rate, mask_prob, random_prob,
                    whole_word_masking, nsp, short_seq_prob, examples_per_row)
    batch_size = _host_batch(global_batch_size, process_count)
    if shuffle_tokens < 1:
        raise ValueError(f"shuffle_tokens={shuffle_tokens} must be at least 1")
    pool = _load(shard_dir, recipe, vocab, process_index=process_index,
                 process_count=process_count, heldout_fraction=heldout_fraction, heldout=False,
                 max_document_tokens=max_document_tokens)
    pipeline = _Pipeline(pool, recipe, vocab, seed=seed, process_index=process_index,
                         shuffle_tokens=shuffle_tokens)
    start = dict(start_position or _position(0, 0, 0))
    if (set(start) != {"epoch", "block", "example"} or min(start.values()) < 0
            or start["block"] >= pipeline.blocks_in_epoch(start["epoch"])):
        raise ValueError(
            f"start_position={start} does not fit this pipeline: it must come from position() "
            "of a pipeline over the same shards, hosts, shuffle_tokens and seed")
    blocks = pipeline.blocks(tf.data.Dataset.counter(start["epoch"])).skip(start["block"])
    return PretrainingIterator(
        pipeline.batches(blocks, batch_size, num_parallel_calls, skip_first=start["example"]),
        start, batch_size)


def eval_dataset(shard_dir: str, *, vocab: Vocab, max_seq_length: int,
                 max_predictions_per_seq: int, global_batch_size: int, seed: int = 0,
                 num_batches: int | None = None, heldout_fraction: float = 0.0,
                 mask_rate: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1,
                 whole_word_masking: bool = False, nsp: bool = True, short_seq_prob: float = 0.1,
                 shuffle_tokens: int = 1 << 19, examples_per_row: int = 1,
                 process_index: int = 0, process_count: int = 1,
                 num_parallel_calls: int = tf.data.AUTOTUNE,
                 max_document_tokens: int = 1_000_000) -> PretrainingIterator:
    """Held-out batches, the same ones at every call: the documents that `pretraining_dataset`
    with the same `heldout_fraction` leaves out, or, with `heldout_fraction=0`, every document
    of `shard_dir` (a separate evaluation directory).

    `num_batches=None` is one pass (remainder dropped); with several hosts pass `num_batches`,
    so that every host runs the same number of steps (the stream then cycles if needed).
    """
    recipe = Recipe(max_seq_length, max_predictions_per_seq, mask_rate, mask_prob, random_prob,
                    whole_word_masking, nsp, short_seq_prob, examples_per_row)
    batch_size = _host_batch(global_batch_size, process_count)
    if num_batches is None and process_count > 1:
        raise ValueError(f"eval_dataset over {process_count} hosts needs num_batches: one pass "
                         "gives each host a different number of batches and the step would hang")
    pool = _load(shard_dir, recipe, vocab, process_index=process_index,
                 process_count=process_count, heldout_fraction=heldout_fraction, heldout=True,
                 max_document_tokens=max_document_tokens)
    pipeline = _Pipeline(pool, recipe, vocab, seed=seed, process_index=process_index,
                         shuffle_tokens=shuffle_tokens)
    epochs = tf.data.Dataset.range(1) if num_batches is None else tf.data.Dataset.counter()
    ds = pipeline.batches(pipeline.blocks(epochs), batch_size, num_parallel_calls)
    if num_batches is not None:
        ds = ds.take(num_batches)
    return PretrainingIterator(ds, _position(0, 0, 0), batch_size)
