"""Shard directories: documents round-trip exactly; a half-written directory is never readable."""
import os

import pytest
import tensorflow as tf

from bertjax.data import shards


def _docs():
    return [[[5, 6, 7], [8]], [[9, 10]], [[11], [12, 13], [14, 15, 16]]]


def test_documents_round_trip(tmp_path):
    manifest = shards.write_documents(str(tmp_path), _docs(), num_shards=2, manifest={"note": "x"})
    assert manifest["documents"] == 3 and manifest["sentences"] == 6 and manifest["tokens"] == 12
    assert manifest["note"] == "x"
    seen = []
    for path in shards.shard_paths(str(tmp_path)):
        for record in tf.data.TFRecordDataset(path):
            doc = shards.parse_document(record)
            ids, lengths = doc["token_ids"].numpy().tolist(), doc["sentence_lengths"].numpy().tolist()
            sentences, start = [], 0
            for n in lengths:
                sentences.append(ids[start:start + n])
                start += n
            seen.append(sentences)
    assert sorted(seen) == sorted(_docs())
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


def test_failed_write_leaves_no_readable_directory(tmp_path):
    def broken():
        yield [[1, 2]]
        raise RuntimeError("corpus reader died")

    with pytest.raises(RuntimeError):
        shards.write_documents(str(tmp_path), broken(), num_shards=2)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="bertjax.prepare"):
        shards.shard_paths(str(tmp_path))
