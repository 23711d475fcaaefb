"""`python -m bertjax.prepare`: a text corpus -> tokenized document shards and a manifest.

  # The embedded Jane Austen corpus, with a SentencePiece model trained on it:
  python -m bertjax.prepare --output=/tmp/austen
  # Your own raw text files (a file is a document) with BERT's uncased WordPiece vocabulary:
  python -m bertjax.prepare --input='books/*.txt' --tokenizer=uncased_L-12_H-768_A-12/vocab.txt \
      --output=data/books

The output directory holds the shards (`bertjax.data.shards` format), `manifest.json` and the
tokenizer file, so `load_tokenizer(output)` and the input pipeline need nothing else. It is
written under a temporary name and moved into place when complete: an interrupted run leaves
nothing behind, and never a half-written corpus.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from typing import Callable, Iterable, Iterator

from absl import app, flags

from bertjax.data import corpus as corpus_lib
from bertjax.data import tokenizers

# Imports stay light (no TensorFlow at module level): worker processes are spawned, and each
# imports this module again. TensorFlow only writes files here: keep it quiet and off devices.


@functools.cache
def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # else it announces itself on stderr
    import tensorflow as tf
    tf.config.set_visible_devices([], "GPU")
    return tf

_INPUT = flags.DEFINE_string(
    "input", None, "Corpus files: a path, a glob or a comma-separated list; for --format=tfds "
    "a dataset 'name[/config]:feature'. Default: the embedded Jane Austen corpus.")
_FORMAT = flags.DEFINE_enum(
    "format", "auto", list(corpus_lib.FORMATS),
    "bert: a sentence per line, blank line between documents; text: raw text, a file is a "
    "document; austen: the embedded corpus, a chapter is a document; jsonl: a document per "
    "line; tfds: a locally prepared TFDS dataset. auto: jsonl for .jsonl/.json, else text.")
_TEXT_KEY = flags.DEFINE_string("text_key", "text", "The text field of --format=jsonl records.")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "Split of a --format=tfds dataset.")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir (default: TFDS's).")
_OUTPUT = flags.DEFINE_string("output", None, "Directory to write the prepared corpus to.")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", "train", "A WordPiece vocab.txt, a SentencePiece .model, a directory holding "
    "one, or 'train' to train a SentencePiece model on the corpus.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size for --tokenizer=train.")
_LOWERCASE = flags.DEFINE_enum(
    "lowercase", "auto", ["auto", "true", "false"],
    "Lower-case the text. auto: cased for --tokenizer=train, a vocab.txt's "
    "tokenizer_config.json (uncased without one). A .model file carries its own setting.")
_SPM_SENTENCES = flags.DEFINE_integer(
    "spm_sample_sentences", 1_000_000, "At most this many sentences (a seeded uniform "
    "sample) train the SentencePiece model.")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 16, "Shard files to write (documents are "
                                   "dealt round-robin); at least the number of data hosts.")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 0, "Processes that split and tokenize; 0: one per CPU (at most 16). The "
    "output is the same for any number.")
_MAX_DOCUMENT_TOKENS = flags.DEFINE_integer(
    "max_document_tokens", 100_000, "Longer documents are split at sentence boundaries "
    "(0: never).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a different prepared corpus "
                               "already in --output.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress line.")

_CHUNK_UNITS = 2048  # paragraphs per worker task: large enough to amortize the round trip


# ---------------------------------------------------------------------------------------------
# Parallel sentence splitting and tokenization, in order, with bounded memory

_worker: dict = {}


def _init_worker(split: Callable, tokenizer_path: str | None) -> None:
    _worker["split"] = split
    _worker["tokenizer"] = tokenizers.load_tokenizer(tokenizer_path) if tokenizer_path else None


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
        _init_worker(split, tokenizer_path)
        for chunk in chunks:
            yield from fn(chunk)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(num_workers, _init_worker, (split, tokenizer_path)) as pool:
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


def _is_remote(path: str) -> bool:
    return "://" in path


def _check_output(output: str, settings: dict, overwrite: bool) -> dict | None:
    """The manifest already in `output` if it holds this same corpus, else None when we may
    write there; an error when it holds something else."""
    tf = _tf()
    from bertjax.data import shards

    if not tf.io.gfile.exists(output):
        return None
    if not tf.io.gfile.isdir(output):
        raise FileExistsError(f"--output {output!r} is a file, expected a directory")
    if not tf.io.gfile.exists(os.path.join(output, shards.MANIFEST)):
        if tf.io.gfile.listdir(output):
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


def _publish(staging: str, output: str) -> None:
    """Moves the complete staging directory to `output`, replacing what was there."""
    tf = _tf()
    from bertjax.data import shards

    if not _is_remote(output):
        trash = None
        if os.path.exists(output):
            trash = f"{output}.old-{uuid.uuid4().hex[:8]}"
            os.rename(output, trash)
        os.rename(staging, output)
        if trash:
            shutil.rmtree(trash)
        return
    # Object stores cannot rename directories: copy file by file, the manifest last, so readers
    # never see the new corpus before it is complete.
    tf.io.gfile.makedirs(output)
    old_manifest = os.path.join(output, shards.MANIFEST)
    if tf.io.gfile.exists(old_manifest):
        tf.io.gfile.remove(old_manifest)
    for name in tf.io.gfile.listdir(output):
        tf.io.gfile.remove(os.path.join(output, name))
    names = sorted(tf.io.gfile.listdir(staging), key=lambda n: n == shards.MANIFEST)
    for name in names:
        tf.io.gfile.copy(os.path.join(staging, name), os.path.join(output, name), overwrite=True)
    tf.io.gfile.rmtree(staging)


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
    tf = _tf()
    from bertjax.data import shards

    if num_shards < 1:
        raise ValueError(f"--num_shards={num_shards}: expected at least 1")
    if tokenizer == "train" and vocab_size < 16:
        raise ValueError(f"--vocab_size={vocab_size}: expected at least 16")
    output = output.rstrip("/")
    source = corpus.describe()
    if tokenizer != "train" and not _is_remote(tokenizer):
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

    staging = f"{output}.tmp-{uuid.uuid4().hex[:8]}"
    tf.io.gfile.makedirs(staging)
    try:
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
        _publish(staging, output)
    except BaseException:
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)
        raise
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


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    lowercase = {"auto": None, "true": True, "false": False}[_LOWERCASE.value]
    num_workers = _NUM_WORKERS.value or min(os.cpu_count() or 1, 16)
    start = time.monotonic()
    try:
        corpus = corpus_lib.Corpus(_INPUT.value, _FORMAT.value, _TEXT_KEY.value,
                                   _TFDS_SPLIT.value, _TFDS_DATA_DIR.value)
        manifest = prepare(corpus, _OUTPUT.value, _TOKENIZER.value, _VOCAB_SIZE.value,
                           lowercase, _NUM_SHARDS.value, num_workers,
                           _MAX_DOCUMENT_TOKENS.value, _SPM_SENTENCES.value,
                           _OVERWRITE.value, _QUIET.value)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as e:
        sys.exit(f"prepare: error: {e.args[0] if e.args else e}")
    if not _QUIET.value:
        split = manifest["split_documents"]
        print(f"{_OUTPUT.value}: {manifest['documents']:,} documents"
              f"{f' ({split:,} long ones split)' if split else ''}, "
              f"{manifest['sentences']:,} sentences, {manifest['tokens']:,} tokens in "
              f"{len(manifest['shards'])} shards, {manifest['tokenizer']['type']} vocabulary "
              f"of {manifest['tokenizer']['vocab_size']:,}; {time.monotonic() - start:.1f}s",
              file=sys.stderr)


if __name__ == "__main__":
    flags.mark_flag_as_required("output")
    app.run(main)
