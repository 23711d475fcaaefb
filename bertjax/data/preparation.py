"""Preparing a pretraining corpus: documents -> sentences -> token ids -> shards + manifest.

The work behind `python -m bertjax.prepare`. Sentence splitting and tokenization run in worker
processes over chunks of documents, in order and with a bounded number of chunks in flight,
so the output is the same for any worker count and memory does not grow with the corpus. The
result is written to a staging directory and published when complete (renamed into place
locally; for a gs:// output, staged on the local disk and copied up, the manifest last).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import time
from typing import Callable, Iterable, Iterator

from bertjax import files
from bertjax.data import corpus as corpus_lib
from bertjax.data import tokenizers

# No TensorFlow at module level: worker processes are spawned, and each imports this module
# (and the `bertjax.prepare` CLI) again. TensorFlow only writes files here.

_CHUNK_UNITS = 2048  # paragraphs per worker task: large enough to amortize the round trip


# ---------------------------------------------------------------------------------------------
# Parallel sentence splitting and tokenization, in order, with bounded memory

_worker: dict = {}


def _init_worker(split: Callable, tokenizer_path: str | None, in_pool: bool) -> None:
    if in_pool:  # parallel across processes: keep each tokenizer to one thread
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["split"] = split
    _worker["tokenizer"] = tokenizers.load_tokenizer(tokenizer_path) if tokenizer_path else None
    if in_pool and isinstance(_worker["tokenizer"], tokenizers.SentencePieceTokenizer):
        _worker["tokenizer"].num_threads = 1


def _split_chunk(chunk: list[list[str]]) -> list[list[str]]:
    return [_worker["split"](units) for units in chunk]


def _tokenize_chunk(chunk: list[list[str]]) -> list[list[list[int]]]:
    """Units of each document -> its sentences' token ids, empty sentences dropped."""
    documents = _split_chunk(chunk)
    ids = _worker["tokenizer"].encode_batch([s for d in documents for s in d])
    result, start = [], 0
    for document in documents:
        result.append([s for s in ids[start:start + len(document)] if s])
        start += len(document)
    return result


def _chunks(documents: Iterable[list[str]]) -> Iterator[list[list[str]]]:
    chunk, units = [], 0
    for document in documents:
        chunk.append(document)
        units += len(document)
        if units >= _CHUNK_UNITS:
            yield chunk
            chunk, units = [], 0
    if chunk:
        yield chunk


def _parallel_map(fn: Callable, chunks: Iterable, num_workers: int, split: Callable,
                  tokenizer_path: str | None) -> Iterator:
    """fn over chunks, results flattened in input order, at most 2 tasks per worker in flight.

    (`Pool.imap` would read the whole input ahead of the workers.) Workers are spawned, not
    forked: the parent may already run TensorFlow and tokenizer threads.
    """
    if num_workers <= 1:
        _init_worker(split, tokenizer_path, in_pool=False)
        for chunk in chunks:
            yield from fn(chunk)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(num_workers, _init_worker, (split, tokenizer_path, True)) as pool:
        pending: collections.deque = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(fn, (chunk,)))
            if len(pending) >= 2 * num_workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def split_long(documents: Iterable[list[list[int]]], max_tokens: int,
               counter: collections.Counter) -> Iterator[list[list[int]]]:
    """Splits documents over `max_tokens` at sentence boundaries; counts them in `counter`."""
    for document in documents:
        if not document:
            continue
        if max_tokens <= 0 or sum(len(s) for s in document) <= max_tokens:
            yield document
            continue
        counter["split_documents"] += 1
        piece, size = [], 0
        for sentence in document:
            if piece and size + len(sentence) > max_tokens:
                yield piece
                piece, size = [], 0
            piece.append(sentence)
            size += len(sentence)
        yield piece


# ---------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A progress line on stderr: documents, tokens, rate and, when the size is known, ETA."""

    def __init__(self, label: str, fraction: Callable[[], float | None], quiet: bool):
        self.label, self.fraction, self.quiet = label, fraction, quiet
        self.documents = self.tokens = 0
        self.start = self._last = time.monotonic()
        self._tty = sys.stderr.isatty()

    def update(self, documents: int = 0, tokens: int = 0) -> None:
        self.documents += documents
        self.tokens += tokens
        now = time.monotonic()
        if not self.quiet and now - self._last >= (0.5 if self._tty else 15.0):
            self._last = now
            self._print("\r" if self._tty else "", "" if self._tty else "\n")

    def done(self) -> None:
        if not self.quiet:
            self._print("\r" if self._tty else "", "\n")

    def _print(self, prefix: str, end: str) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        line = f"{self.label}: {self.documents:,} documents"
        if self.tokens:
            line += f", {self.tokens:,} tokens, {self.tokens / elapsed:,.0f} tokens/s"
        fraction = self.fraction()
        if fraction:
            eta = elapsed * (1 - fraction) / fraction
            line += f", {fraction:.0%}, ETA {eta:.0f}s"
        line += f", {elapsed:.1f}s"
        sys.stderr.write(f"{prefix}{line:<100}{end}")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Output directory


def _check_output(output: str, settings: dict, overwrite: bool) -> dict | None:
    """The manifest already in `output` if it holds this same corpus, else None when we may
    write there; an error when it holds something else."""
    from bertjax.data import shards

    out = files.path(output)
    if not out.exists():
        return None
    if not out.is_dir():
        raise FileExistsError(f"--output {output!r} is a file, expected a directory")
    if not (out / shards.MANIFEST).exists():
        if any(out.iterdir()):
            raise FileExistsError(
                f"--output {output!r} is not empty and holds no prepared corpus; refusing to "
                "write into it (choose a new or empty directory)")
        return None
    existing = shards.read_manifest(output)
    if overwrite:
        return None
    previous = {"source": existing.get("source"), "settings": existing.get("settings")}
    if previous == settings:
        return existing
    differing = sorted(k for part in ("source", "settings")
                       for k in set(settings[part]) | set(previous[part] or {})
                       if settings[part].get(k) != (previous[part] or {}).get(k))
    raise FileExistsError(
        f"--output {output!r} already holds a different prepared corpus (differs in "
        f"{', '.join(differing)}); pass --overwrite to replace it")


# ---------------------------------------------------------------------------------------------
# The whole run


def prepare(corpus: corpus_lib.Corpus, output: str, tokenizer: str = "train",
            vocab_size: int = 8000, lowercase: bool | None = None, num_shards: int = 16,
            num_workers: int = 1, max_document_tokens: int = 100_000,
            spm_sample_sentences: int = 1_000_000, overwrite: bool = False,
            quiet: bool = False) -> dict:
    """Tokenizes `corpus` into shards in `output`; returns the manifest.

    `tokenizer` is a tokenizer path for `load_tokenizer`, or "train" for a SentencePiece model
    of `vocab_size` trained on the corpus. `lowercase` None takes the tokenizer's own setting.
    """
    from bertjax.data import shards, tensorflow
    tensorflow()

    if num_shards < 1:
        raise ValueError(f"--num_shards={num_shards}: expected at least 1")
    if tokenizer == "train" and vocab_size < 16:
        raise ValueError(f"--vocab_size={vocab_size}: expected at least 16")
    output, tokenizer = os.fspath(output).rstrip("/"), os.fspath(tokenizer)
    source = corpus.describe()
    if tokenizer != "train" and not files.is_remote(tokenizer):
        tokenizer = os.path.abspath(tokenizer)
    settings = {"tokenizer": tokenizer,
                "vocab_size": vocab_size if tokenizer == "train" else None,
                "lowercase": lowercase, "num_shards": num_shards,
                "max_document_tokens": max_document_tokens}
    existing = _check_output(output, {"source": source, "settings": settings}, overwrite)
    if existing is not None:
        if not quiet:
            print(f"{output} already holds this corpus, prepared with the same settings; "
                  "nothing to do (--overwrite to prepare it again)", file=sys.stderr)
        return existing

    with files.staged_directory(output, shards.MANIFEST) as stage:
        staging = os.fspath(stage)
        tok = _make_tokenizer(corpus, staging, tokenizer, vocab_size, lowercase, num_workers,
                              spm_sample_sentences, quiet)
        progress = Progress("tokenizing", corpus.fraction, quiet)
        counter: collections.Counter = collections.Counter()
        tokenized = _parallel_map(_tokenize_chunk, _chunks(corpus.units()), num_workers,
                                  corpus.splitter, os.path.join(staging, tok.file_name))

        def counted(documents):
            for document in documents:
                progress.update(1, sum(len(s) for s in document))
                yield document

        manifest = shards.write_documents(
            staging, counted(split_long(tokenized, max_document_tokens, counter)), num_shards)
        progress.done()
        if manifest["documents"] < 2:
            raise ValueError(
                f"input {corpus.spec!r} gives {manifest['documents']} document(s); "
                "next-sentence prediction needs at least two (with --format=text each file "
                "is one document: give several files, or use --format=bert with blank lines "
                "between documents)")
        manifest.update(tokenizer=tok.describe(), source=source, settings=settings,
                        split_documents=counter["split_documents"],
                        created_by="bertjax.prepare")
        shards.write_manifest(staging, manifest)
    return shards.read_manifest(output)


def _make_tokenizer(corpus: corpus_lib.Corpus, directory: str, spec: str, vocab_size: int,
                    lowercase: bool | None, num_workers: int, sample_sentences: int,
                    quiet: bool) -> tokenizers.Tokenizer:
    """Loads or trains the tokenizer and saves it into `directory`."""
    if spec != "train":
        tok = tokenizers.load_tokenizer(spec)
        if isinstance(tok, tokenizers.WordPieceTokenizer):
            if lowercase is not None and lowercase != tok.lowercase:
                tok = tokenizers.WordPieceTokenizer(tok.path, lowercase=lowercase)
        elif lowercase is not None and lowercase != tok.lowercase:
            raise ValueError(f"--lowercase={str(lowercase).lower()} contradicts SentencePiece "
                             f"model {spec!r}, whose normalization is "
                             f"{'un' if tok.lowercase else ''}cased")
        tok.save(directory)
        return tok
    progress = Progress("reading sentences for SentencePiece", corpus.fraction, quiet)

    def sentences():
        for document in _parallel_map(_split_chunk, _chunks(corpus.units()), num_workers,
                                      corpus.splitter, None):
            progress.update(1)
            yield from document
        progress.done()

    start = time.monotonic()
    tok = tokenizers.train_sentencepiece(sentences(), vocab_size, directory,
                                         lowercase=bool(lowercase),
                                         max_sentences=sample_sentences)
    if not quiet:
        print(f"trained a SentencePiece model of {tok.vocab_size:,} pieces in "
              f"{time.monotonic() - start:.1f}s", file=sys.stderr)
    return tok
