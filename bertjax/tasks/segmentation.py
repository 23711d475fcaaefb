"""Chinese word segmentation as character tagging: the `segmentation` task.

Training and evaluation files are segmented text, one sentence a line with its words
separated by spaces (the SIGHAN bakeoff layout), or CoNLL-style `character tag` lines with
BMES or BIES tags (tagging.py reads those). Every character is tagged B, M, E or S (begins,
continues, ends a word, or is a word alone), the model learns the tags as any tagging model
does, and the predicted tags are decoded into words. Scores are word-level precision, recall
and F1 (a word counts when its span is exactly a gold word's), and the recall of gold words
the training set never shows (`oov_recall`).

Files to predict on hold one raw sentence a line (spaces are ignored); an empty line stays
an empty prediction, so the output lines up with the input. In training files, a line with
no space at all is one word: such lines are counted and logged, and a file where most lines
have none is an error (it is raw text, not segmented).
"""

from __future__ import annotations

import logging

from bertjax import files
from bertjax.tasks import tag_schemes
from bertjax.tasks.base import register
from bertjax.tasks.features import LabelVocab
from bertjax.tasks.tagging import (SegmentationTags, TaggedSentence, Tagging, read_conll,
                                    tag_vocab)

log = logging.getLogger(__name__)


def read_segmented(path: str, labelled: bool = True) -> list[TaggedSentence]:
    """Sentences of a segmented text file as characters with their BMES tags; with
    `labelled=False`, the characters of every line (raw text to segment)."""
    name = files.path(path).name
    sentences, blank, unspaced, first_unspaced = [], 0, 0, None
    for line_num, line in enumerate(files.read_text(path).splitlines(), 1):
        words = line.split()
        guid = f"{name}:{line_num}"
        if not labelled:
            sentences.append(TaggedSentence(guid, [c for w in words for c in w]))
            continue
        if not words:
            blank += 1
            continue
        if len(words) == 1 and len(words[0]) > 1:
            unspaced += 1
            first_unspaced = first_unspaced or guid
        sentences.append(TaggedSentence(guid, [c for w in words for c in w],
                                        tag_schemes.segmentation_tags(len(w) for w in words)))
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    if unspaced * 2 > len(sentences):
        raise ValueError(f"{path}: {unspaced} of {len(sentences)} lines have no space between "
                         f"words (first: {first_unspaced}): expected segmented text, one "
                         f"sentence a line with its words separated by spaces")
    if unspaced:
        log.warning("%s: %d lines have no space; each is read as a single word (first: %s)",
                    path, unspaced, first_unspaced)
    if blank:
        log.info("%s: %d blank lines hold no sentence", path, blank)
    return sentences


def looks_like_conll(path: str) -> bool:
    """Every non-blank line is one character and a segmentation tag."""
    lines = [line.split() for line in files.read_text(path).splitlines() if line.strip()]
    return bool(lines) and all(len(f) == 2 and len(f[0]) == 1
                               and f[1] in tag_schemes.SEGMENTATION_TAGS for f in lines)


@register
class Segmentation(Tagging):
    """Tagging whose tags are segmentation tags, reading segmented text too; `python -m
    bertjax.predict segment` prints the words it finds, separated by spaces."""

    name = "segmentation"
    command = "segment"
    higher_is_better = ("f1", "precision", "recall", "token_accuracy", "oov_recall")

    def __init__(self, settings):
        if settings.scheme not in (None, "segmentation"):
            raise ValueError(f"task.scheme {settings.scheme!r}: task.type segmentation tags "
                             f"segmentation only (leave task.scheme unset)")
        super().__init__(settings)
        self.tags = SegmentationTags()

    def read(self, path: str, labelled: bool) -> list[TaggedSentence]:
        s = self.settings
        fmt = s.format or ("conll" if labelled and looks_like_conll(path) else "text")
        if fmt == "conll":
            return read_conll(path, labelled=labelled, strict=s.strict_tags,
                              kind="segmentation")
        if fmt != "text":
            raise ValueError(f"{path}: task.type segmentation reads text (one sentence a line, "
                             f"words separated by spaces) or conll files, not {fmt}")
        return read_segmented(path, labelled)

    def label_vocab(self, train_examples: list) -> LabelVocab:
        self.tags.learn(train_examples)
        return tag_vocab(train_examples)
