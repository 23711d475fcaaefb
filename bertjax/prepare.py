"""`python -m bertjax.prepare`: a text corpus -> tokenized document shards and a manifest.

  # The embedded Jane Austen corpus, with a SentencePiece model trained on it:
  python -m bertjax.prepare --output=/tmp/austen
  # Your own raw text files (a file is a document) with BERT's uncased WordPiece vocabulary:
  python -m bertjax.prepare --input='books/*.txt' --tokenizer=uncased_L-12_H-768_A-12/vocab.txt \
      --output=data/books

The output directory holds the shards (`bertjax.data.shards` format), `manifest.json` and the
tokenizer file, so `load_tokenizer(output)` and the input pipeline need nothing else. It is
written under a temporary name and moved into place when complete: an interrupted run leaves
nothing behind, and never a half-written corpus. The work is `bertjax.data.preparation`.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

from bertjax import cli
from bertjax.data import corpus as corpus_lib
from bertjax.data import preparation

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

def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    lowercase = {"auto": None, "true": True, "false": False}[_LOWERCASE.value]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    num_workers = _NUM_WORKERS.value or min(cpus or 1, 16)
    start = time.monotonic()
    with cli.one_line_errors("prepare"):
        corpus = corpus_lib.Corpus(_INPUT.value, _FORMAT.value, _TEXT_KEY.value,
                                   _TFDS_SPLIT.value, _TFDS_DATA_DIR.value)
        manifest = preparation.prepare(
            corpus, _OUTPUT.value, tokenizer=_TOKENIZER.value, vocab_size=_VOCAB_SIZE.value,
            lowercase=lowercase, num_shards=_NUM_SHARDS.value, num_workers=num_workers,
            max_document_tokens=_MAX_DOCUMENT_TOKENS.value,
            spm_sample_sentences=_SPM_SENTENCES.value, overwrite=_OVERWRITE.value,
            quiet=_QUIET.value)
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
