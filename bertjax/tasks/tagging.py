"""Token tagging (NER): CoNLL-style files, their fixed-length features, and the task.

A file holds one token per line, its tag in the last field (fields split by tabs when the
line has one, else by spaces, so both `word<TAB>tag` and CoNLL-2003's `word POS chunk tag`
read), a blank (or whitespace-only) line between sentences, `-DOCSTART-` lines skipped.

Tag schemes are BIO and BIOES (detected per file, or given). A tag that breaks the scheme
(BIO: an `I-X` not after `B-X`/`I-X`) is *repaired*, not rejected: the sentence is decoded the
way the entity metric decodes it (seqeval default mode; the stray `I-X` starts an entity)
and re-encoded, and the number of repaired tags is logged with the first file:line. Real
data needs this (WNUT and IOB1-style CoNLL files hold such tags); `strict=True` raises on the
first one instead.

Each word is tokenized on its own; `label_ids` holds the tag id at the word's first
sub-token and -1 (ignored by the loss and the metric) elsewhere. A sentence too long for one
row is split at word boundaries over several rows (counted); `example_index` and `word_ids`
map every row back so predictions come out per word.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import re
from typing import Sequence

import jax.numpy as jnp
import numpy as np
import optax

from bertjax import files
from bertjax.models.heads import BertForTokenClassification
from bertjax.tasks import metrics
from bertjax.tasks import tag_schemes as tagging
from bertjax.tasks.base import Task, TaskSet, register
from bertjax.tasks.features import Features, LabelVocab, Packer, WordEncoder, stack

log = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"


@dataclasses.dataclass
class TaggedSentence:
    guid: str  # file:line of its first token
    words: list[str]
    tags: list[str] | None = None


def read_conll(path: str, scheme: str | None = None, labelled: bool = True,
               strict: bool = False) -> list[TaggedSentence]:
    """Sentences of a CoNLL-style file; `labelled=False` reads token-only files (for predict)."""
    text = files.read_text(path)
    name = files.path(path).name
    sentences, words, tags, lines = [], [], [], []

    def flush():
        if words:
            sentences.append((TaggedSentence(f"{name}:{lines[0]}", list(words),
                                             list(tags) if labelled else None), list(lines)))
        words.clear()
        tags.clear()
        lines.clear()

    with io.StringIO(text) as f:
        for line_num, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            fields = [x.strip() for x in (line.split("\t") if "\t" in line else line.split())]
            fields = [x for x in fields if x]
            if fields[0] == DOCSTART:
                flush()
                continue
            if labelled and len(fields) < 2:
                raise ValueError(f"{path}:{line_num}: expected a token and a tag, found "
                                 f"{line!r}")
            if labelled:
                try:
                    tagging.parse_tag(fields[-1])
                except ValueError as e:
                    raise ValueError(f"{path}:{line_num}: {e}") from None
                tags.append(fields[-1])
            words.append(fields[0])
            lines.append(line_num)
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    if labelled:
        _check_scheme(path, sentences, scheme, strict)
    return [s for s, _ in sentences]


def _check_scheme(path: str, sentences, scheme: str | None, strict: bool) -> None:
    found = tagging.detect_scheme(t for s, _ in sentences for t in s.tags)
    scheme = scheme or found
    if scheme not in tagging.SCHEMES:
        raise ValueError(f"tag scheme {scheme!r}: expected one of {', '.join(tagging.SCHEMES)}")
    if scheme == "BIO" and found == "BIOES":
        raise ValueError(f"{path}: holds E-/S- tags but the scheme is BIO")
    repaired, first = 0, None
    for sentence, lines in sentences:
        fixed = tagging.canonical(sentence.tags, scheme)
        bad = [i for i, (a, b) in enumerate(zip(sentence.tags, fixed)) if a != b]
        if not bad:
            continue
        i = bad[0]
        where = f"{path}:{lines[i]}"
        prev = sentence.tags[i - 1] if i else "the sentence start"
        message = f"{where}: tag {sentence.tags[i]!r} cannot follow {prev!r} in {scheme}"
        if strict:
            raise ValueError(message)
        first = first or message
        repaired += len(bad)
        sentence.tags = fixed
    if repaired:
        log.warning("%s: repaired %d tags that break the %s scheme (first: %s)", path,
                    repaired, scheme, first)


def tag_vocab(sentences: Sequence[TaggedSentence]) -> LabelVocab:
    """The training set's tags, 'O' first."""
    return LabelVocab.from_labels((t for s in sentences for t in s.tags), first="O")


def tagging_features(sentences: Sequence[TaggedSentence], tokenizer, max_seq_length: int,
                     label_vocab: LabelVocab | None = None) -> Features:
    """input_ids / input_mask / segment_ids / label_ids [N, L] (label_ids only with tags),
    example_index [N] and word_ids [N, L] (the word at each first sub-token, else -1)."""
    packer = Packer(tokenizer, max_seq_length)
    encode = WordEncoder(tokenizer)
    budget = max_seq_length - 2
    has_tags = bool(sentences) and all(s.tags is not None for s in sentences)
    if has_tags and label_vocab is None:
        raise ValueError("tags need a label vocabulary (from the training set)")
    rows, split, cut_words = [], 0, 0
    for index, sentence in enumerate(sentences):
        word_ids = encode(sentence.words)
        tag_ids = ([label_vocab.id(t, sentence.guid) for t in sentence.tags] if has_tags
                   else [-1] * len(word_ids))
        chunks = _chunks([len(w) for w in word_ids], budget)
        split += len(chunks) > 1
        for first, last in chunks:
            tokens, labels, words = [], [], []
            for w in range(first, last):
                pieces = word_ids[w][:budget]  # a single word longer than a row is cut
                cut_words += len(pieces) < len(word_ids[w])
                tokens += pieces
                labels += [tag_ids[w]] + [-1] * (len(pieces) - 1)
                words += [w] + [-1] * (len(pieces) - 1)
            ids, mask, segments = packer.pack(tokens)
            pad = max_seq_length - len(tokens) - 1
            rows.append((ids, mask, segments, _row(labels, pad), np.int32(index),
                         _row(words, pad)))
    names = ["input_ids", "input_mask", "segment_ids", "label_ids", "example_index", "word_ids"]
    arrays = stack(rows, names)
    if not has_tags:
        del arrays["label_ids"]
    if split:
        log.info("%d of %d sentences longer than %d tokens were split over several rows",
                 split, len(sentences), max_seq_length)
    return Features(arrays, {"examples": len(sentences), "split": split, "cut_words": cut_words})


def _row(values: list[int], pad: int) -> np.ndarray:
    """-1 at [CLS], the values, then -1 at [SEP] and the padding."""
    return np.array([-1] + values + [-1] * pad, np.int32)


def _chunks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive word ranges [first, last) whose tokens fit `budget` (a word at least alone)."""
    chunks, first, used = [], 0, 0
    for w, n in enumerate(lengths):
        n = min(n, budget)
        if used + n > budget:
            chunks.append((first, w))
            first, used = w, 0
        used += n
    chunks.append((first, len(lengths)))
    return chunks


def word_predictions(features: Features, predicted_NL: np.ndarray,
                     sentences: Sequence[TaggedSentence]) -> list[np.ndarray]:
    """Per sentence, the predicted id of each word (read at its first sub-token)."""
    out = [np.full(len(s.words), -1, np.int64) for s in sentences]
    example_index, word_ids = features.arrays["example_index"], features.arrays["word_ids"]
    for row in range(len(features)):
        at = word_ids[row] >= 0
        out[example_index[row]][word_ids[row][at]] = predicted_NL[row][at]
    return out


_WORD_SPLIT = re.compile(r"\S+")


def words_of(text: str) -> list[str]:
    """Whitespace words of raw text, for tagging free text (`predict --text`)."""
    return _WORD_SPLIT.findall(text)


@register
class Tagging(Task):
    name = "tagging"
    command = "tag"
    targets = ("label_ids",)
    best_metric = "f1"
    higher_is_better = ("f1", "precision", "recall", "token_accuracy")
    uses_labels = True
    saved_settings = ("max_seq_length", "tag_scheme")

    def read(self, path: str, labelled: bool) -> list[TaggedSentence]:
        s = self.settings
        if s.format and s.format != "conll":
            raise ValueError(f"{path}: task.type tagging reads conll files, not {s.format}")
        return read_conll(path, scheme=s.tag_scheme or None, labelled=labelled,
                          strict=s.strict_tags)

    def label_vocab(self, train_examples: list) -> LabelVocab:
        return tag_vocab(train_examples)

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        return tagging_features(examples, tokenizer, self.settings.max_seq_length, labels)

    def examples_from_texts(self, texts, context: str = "") -> list[TaggedSentence]:
        return [TaggedSentence(f"text{i}", words_of(t)) for i, t in enumerate(texts)]

    def model(self, config, labels: LabelVocab):
        return BertForTokenClassification(config, len(labels))

    def normalizer(self, batch):
        return jnp.maximum(jnp.sum((batch["label_ids"] >= 0).astype(jnp.float32)), 1.0)

    def loss_sum(self, logits_BLC, batch):
        labels_BL = batch["label_ids"].astype(jnp.int32)
        ce_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLC,
                                                                jnp.maximum(labels_BL, 0))
        return jnp.sum(jnp.where(labels_BL >= 0, ce_BL, 0.0))

    def fetch(self, logits_BLC):
        return jnp.argmax(logits_BLC, axis=-1).astype(jnp.int32)

    def evaluate(self, taskset: TaskSet, ids_NL, labels: LabelVocab):
        words = word_predictions(taskset.features, ids_NL, taskset.examples)
        predicted = [[labels.labels[i] for i in w] for w in words]
        scores = {}
        if taskset.labelled:
            gold = [s.tags for s in taskset.examples]
            entity = metrics.entity_scores(gold, predicted)
            correct = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs))
            scores = {k: entity[k] for k in ("precision", "recall", "f1")}
            scores["token_accuracy"] = correct / sum(len(g) for g in gold)
        records = []
        for sentence, tags in zip(taskset.examples, predicted):
            record = {"guid": sentence.guid, "words": sentence.words}
            if sentence.tags is not None:
                record["tags"] = sentence.tags
            record["predictions"] = tags
            records.append(record)
        return scores, records

    def format_record(self, record: dict) -> str:
        return " ".join(f"{w}/{t}" for w, t in zip(record["words"], record["predictions"]))
