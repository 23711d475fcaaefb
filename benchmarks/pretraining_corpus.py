"""The embedded Austen corpus as the pretraining-pipeline benchmarks read it: chapters as
lists of sentences, tokenized as `prepare` tokenizes them, written as document shards."""

from __future__ import annotations

import os
import time


def austen_documents() -> list[list[str]]:
    """The embedded corpus: chapters as lists of sentences."""
    from bertjax.data import corpus
    return list(corpus.Corpus().documents())


def tokenize(tokenizer, docs: list[list[str]]) -> tuple[list[list[list[int]]], float]:
    """The documents as prepare tokenizes them (empty sentences dropped), and the seconds."""
    start = time.perf_counter()
    flat = tokenizer.encode_batch([s for d in docs for s in d])
    seconds = time.perf_counter() - start
    tokenized, i = [], 0
    for d in docs:
        tokenized.append([ids for ids in flat[i:i + len(d)] if ids])
        i += len(d)
    return tokenized, seconds


def build_shards(workdir: str, tokenized: list[list[list[int]]]) -> str:
    """The tokenized documents as shards under `workdir` (kept: built once)."""
    from bertjax.data import shards
    directory = os.path.join(workdir, "austen-wordpiece")
    if not os.path.exists(os.path.join(directory, shards.MANIFEST)):
        shards.write_documents(directory, tokenized, num_shards=4)
    return directory
