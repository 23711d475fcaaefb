"""A host's tokenized documents, read from its shard files and held in memory as flat arrays.

The pretraining pipeline needs random access to *any* document of the host (the random "next
sentence" of NSP comes from another document), so each host loads its own documents once:

  tokens           [T]    every token of every document, document after document
  sentence_starts  [S+1]  token offset where each sentence starts, then T
  document_starts  [D+1]  sentence offset where each document starts, then S

Tokens are stored as uint16 when the vocabulary fits (2 bytes per token), else int32, so a
host holds about 2 GB per billion tokens: comfortable up to a few billion tokens per host,
which covers BERT's original 3.3B-word corpus split over even a handful of hosts.

Which documents are held out for evaluation is decided per document by a stable hash of
(shard file name, record index), so the split is the same whatever the number of hosts.
Empty sentences and empty documents are dropped on load.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import numpy as np
import tensorflow as tf

from bertjax import files
from bertjax.data import shards

_READ_BATCH = 256


@dataclasses.dataclass(frozen=True)
class DocumentPool:
    tokens: np.ndarray
    sentence_starts: np.ndarray
    document_starts: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_starts) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def document(self, index: int) -> list[list[int]]:
        """Document `index` as a list of sentences of token ids (for inspection and tests)."""
        s0, s1 = self.document_starts[index], self.document_starts[index + 1]
        bounds = self.sentence_starts[s0:s1 + 1]
        return [self.tokens[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]


def host_shard_paths(shard_dir: str, process_index: int, process_count: int) -> list[str]:
    """The shard files host `process_index` reads: i, i + n, i + 2n, ... of the manifest."""
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} is not in [0, process_count={process_count})")
    if not files.path(shard_dir).is_dir():
        raise FileNotFoundError(f"shard directory {shard_dir!r} does not exist "
                                "(run `python -m bertjax.prepare` to create it)")
    paths = shards.shard_paths(shard_dir)
    if len(paths) < process_count:
        raise ValueError(
            f"{shard_dir}: {len(paths)} shard files for {process_count} hosts; every host needs "
            f"at least one file: re-run prepare with at least {process_count} shards")
    return paths[process_index::process_count]


def heldout_scores(file_name: str, first: int, count: int) -> np.ndarray:
    """float64 [count] in [0, 1): a stable pseudo-random score for records first, first + 1, ...
    of a shard file.

    A document is held out when its score is below the held-out fraction. The score depends
    only on the file's base name and the record index (splitmix64 finaliser), never on hosts.
    """
    key = np.uint64(zlib.crc32(os.path.basename(file_name).encode())) << np.uint64(32)
    z = key + np.arange(first, first + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _read_file(path: str):
    """Yields (token_ids, sentence_lengths) RaggedTensor-as-numpy batches of one shard file;
    a damaged file (TFRecord checks a CRC32C per record) is an error naming it."""
    ds = tf.data.TFRecordDataset(path).batch(_READ_BATCH)
    ds = ds.map(lambda records: tf.io.parse_example(records, shards.FEATURES),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    try:
        for batch in ds.prefetch(2):
            ids, lengths = batch["token_ids"], batch["sentence_lengths"]
            yield (ids.flat_values.numpy(), ids.row_lengths().numpy(),
                   lengths.flat_values.numpy(), lengths.row_lengths().numpy())
    except tf.errors.OpError as e:
        reason = e.message.strip().splitlines()[0] if e.message else type(e).__name__
        raise ValueError(f"shard {path} is corrupt ({reason}); prepare the corpus again") \
            from None


def _check_counts(path: str, documents: int, tokens: int, expected: dict | None) -> None:
    if expected is not None and (documents, tokens) != (expected["documents"],
                                                        expected["tokens"]):
        raise ValueError(f"shard {path} holds {documents} documents and {tokens} tokens, the "
                         f"manifest says {expected['documents']} and {expected['tokens']}: it "
                         f"is truncated or was replaced; prepare the corpus again")


def load_pool(paths: list[str], *, vocab_size: int, max_document_tokens: int,
              heldout_fraction: float, heldout: bool,
              expected_counts: dict | None = None) -> DocumentPool:
    """Reads the documents of `paths`: the held-out ones if `heldout`, else the others.

    `heldout_fraction == 0` with `heldout=True` means every document (a separate eval
    directory). `expected_counts` (the manifest's, by file name) are checked file by file.
    """
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
    token_parts, sentence_parts, doc_sentence_counts = [], [], []
    for path in paths:
        record, file_tokens = 0, 0
        for ids, doc_tokens, sent_lengths, doc_sentences in _read_file(path):
            file_tokens += int(doc_tokens.sum())
            count = len(doc_tokens)
            _check_batch(path, record, ids, doc_tokens, sent_lengths, doc_sentences,
                         vocab_size, max_document_tokens)
            scores = heldout_scores(path, record, count)
            keep = scores < heldout_fraction if heldout else scores >= heldout_fraction
            if heldout and heldout_fraction == 0:
                keep = np.ones(count, bool)
            record += count
            if not keep.any():
                continue
            token_keep = np.repeat(keep, doc_tokens)
            sentence_keep = np.repeat(keep, doc_sentences) & (sent_lengths > 0)
            sentence_doc = np.repeat(np.arange(count), doc_sentences)[sentence_keep]
            token_parts.append(ids[token_keep].astype(dtype))
            sentence_parts.append(sent_lengths[sentence_keep])
            per_doc = np.bincount(sentence_doc, minlength=count)[keep]
            doc_sentence_counts.append(per_doc[per_doc > 0])
        _check_counts(path, record, file_tokens,
                      (expected_counts or {}).get(path.rsplit("/", 1)[-1]))
    tokens = np.concatenate(token_parts or [np.zeros(0, dtype)])
    lengths = np.concatenate(sentence_parts or [np.zeros(0, np.int64)])
    counts = np.concatenate(doc_sentence_counts or [np.zeros(0, np.int64)])
    sentence_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    document_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return DocumentPool(tokens, sentence_starts, document_starts)


def _check_batch(path, first_record, ids, doc_tokens, sent_lengths, doc_sentences,
                 vocab_size, max_document_tokens):
    doc_of_sentence = np.repeat(np.arange(len(doc_sentences)), doc_sentences)
    summed = np.bincount(doc_of_sentence, weights=sent_lengths, minlength=len(doc_tokens))
    negative = np.zeros(len(doc_tokens), bool)
    negative[doc_of_sentence[sent_lengths < 0]] = True
    bad = np.flatnonzero((summed != doc_tokens) | negative)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{path}: document {first_record + i}: sentence_lengths "
                         f"{sent_lengths[doc_of_sentence == i][:8].tolist()}... do not split its "
                         f"{int(doc_tokens[i])} token_ids (corrupt shard; re-run prepare)")
    too_long = np.flatnonzero(doc_tokens > max_document_tokens)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(
            f"{path}: document {first_record + i} has {int(doc_tokens[i]):,} tokens, more than "
            f"max_document_tokens={max_document_tokens:,}; is a document separator missing in "
            "the corpus? Split such documents when preparing, or raise max_document_tokens")
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        value = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ValueError(f"{path}: token id {value} outside the vocabulary [0, {vocab_size}): "
                         "the shards were prepared with another tokenizer")
