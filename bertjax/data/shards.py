"""Tokenized document shards: the on-disk contract between `prepare` and the input pipeline.

A shard directory holds TFRecord files of `tf.train.Example`s, one per document, and a
`manifest.json` written last. Each document is stored flat so it parses with one op:

  token_ids         int64 list: every token of the document, sentence after sentence
  sentence_lengths  int64 list: tokens per sentence (sums to len(token_ids))

Files are written under a temporary name and renamed when complete, and the manifest appears
only after every shard is in place, so a reader never sees a half-written directory. Files
are reached through `bertjax.files` (and TFRecords through tf.io, which reads the same
gs:// paths), so remote paths work as local ones do.
"""

from __future__ import annotations

import os
import uuid
from typing import Iterable, Sequence

import tensorflow as tf

from bertjax import files

MANIFEST = "manifest.json"
FORMAT = "bertjax-documents-v1"

FEATURES = {
    "token_ids": tf.io.RaggedFeature(tf.int64),
    "sentence_lengths": tf.io.RaggedFeature(tf.int64),
}

Document = Sequence[Sequence[int]]  # sentences, each a sequence of token ids


def shard_name(index: int, count: int) -> str:
    return f"documents-{index:05d}-of-{count:05d}.tfrecord"


def serialize_document(sentences: Document) -> bytes:
    flat = [int(t) for s in sentences for t in s]
    lengths = [len(s) for s in sentences]
    feature = {
        "token_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=flat)),
        "sentence_lengths": tf.train.Feature(int64_list=tf.train.Int64List(value=lengths)),
    }
    # deterministic: protobuf map order otherwise varies by process, and shards should be
    # byte-identical across runs of the same prepare.
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


def parse_document(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """TF op: one serialized document -> {'token_ids': int32 [N], 'sentence_lengths': int32 [S]}."""
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    return {k: tf.cast(v, tf.int32) for k, v in parsed.items()}


class AtomicShardWriter:
    """Writes one TFRecord shard under a temporary name; `close()` renames it into place."""

    def __init__(self, path: str):
        self.path = path
        self._tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self._writer = tf.io.TFRecordWriter(self._tmp)
        self.documents = 0

    def write(self, sentences: Document) -> None:
        self._writer.write(serialize_document(sentences))
        self.documents += 1

    def close(self) -> None:
        self._writer.close()
        files.path(self._tmp).replace(files.path(self.path))

    def abort(self) -> None:
        self._writer.close()
        files.remove_tree(self._tmp)


def write_manifest(directory: str, manifest: dict) -> None:
    """Writes the manifest atomically; it names the shards and marks the directory complete."""
    files.write_json(os.path.join(directory, MANIFEST), {"format": FORMAT, **manifest},
                     indent=2, sort_keys=True)


def read_manifest(directory: str) -> dict:
    path = os.path.join(directory, MANIFEST)
    if not files.path(path).exists():
        raise FileNotFoundError(
            f"{path} not found: {directory!r} is not a prepared shard directory "
            "(run `python -m bertjax.prepare` first, and let it finish)")
    manifest = files.read_json(path)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def shard_paths(directory: str) -> list[str]:
    """The shard files a complete directory's manifest names, checked to exist."""
    manifest = read_manifest(directory)
    paths = [os.path.join(directory, name) for name in manifest["shards"]]
    missing = [p for p in paths if not files.path(p).exists()]
    if missing:
        raise FileNotFoundError(f"{directory}: manifest names missing shard files: {missing[:3]}")
    return paths


def write_documents(directory: str, documents: Iterable[Document], num_shards: int,
                    manifest: dict | None = None) -> dict:
    """Streams documents round-robin into `num_shards` shards and writes the manifest.

    Returns the manifest. Memory stays bounded by one document whatever the corpus size.
    """
    files.makedirs(directory)
    names = [shard_name(i, num_shards) for i in range(num_shards)]
    writers = [AtomicShardWriter(os.path.join(directory, n)) for n in names]
    counts = {"documents": 0, "sentences": 0, "tokens": 0}
    per_shard = {name: {"documents": 0, "tokens": 0} for name in names}
    try:
        for i, doc in enumerate(documents):
            writers[i % num_shards].write(doc)
            tokens = sum(len(s) for s in doc)
            counts["documents"] += 1
            counts["sentences"] += len(doc)
            counts["tokens"] += tokens
            per_shard[names[i % num_shards]]["documents"] += 1
            per_shard[names[i % num_shards]]["tokens"] += tokens
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    # Per-shard counts let a reader tell a shard truncated at a record boundary (which
    # TFRecord's per-record CRC32C cannot) from a complete one.
    full = {**(manifest or {}), **counts, "shards": names, "shard_counts": per_shard}
    write_manifest(directory, full)
    return read_manifest(directory)
