"""Token tagging: CoNLL-style files, their fixed-length features, and the task.

A file holds one token per line, its tag in the last field (fields split by tabs when the
line has one, else by spaces, so both `word<TAB>tag` and CoNLL-2003's `word POS chunk tag`
read), a blank (or whitespace-only) line between sentences, `-DOCSTART-` lines skipped.

Tags are of one kind per file (`task.scheme`, see tag_schemes.py; detected unless given):
entity spans (BIO/BIOES: NER, chunks), plain classes (part of speech, any `token label`), or
word segmentation (BMES/BIES, one character a line: Chinese word segmentation). A file that
mixes entity tags with plain ones is an error naming both lines. A tag that breaks its
scheme (BIO: an `I-X` not after `B-X`/`I-X`; BMES: an `M` after an `E`) is *repaired*, not
rejected: the sentence is decoded the way the metric decodes it (the entity metric:
seqeval's default mode, the stray `I-X` starts an entity) and re-encoded, and the number of
repaired tags is logged with the first file:line. Real data needs this (WNUT and IOB1-style
CoNLL files hold such tags); `strict=True` raises on the first one instead.

Each word is encoded as it reads in running text (features.WordEncoder: a Chinese character
after another one carries no word-start mark), and `label_ids` holds its tag id at its
first piece that carries text (features.HeadFinder), -1 (ignored by the loss and the metric)
elsewhere. A sentence too long for one row is covered by overlapping windows `stride` pieces
apart, as SQuAD contexts are, and each word is labelled and scored in one window only: the
one where it has the most context on either side. `example_index` and `word_ids` map every
row back so predictions come out per word. A sentence that fits one row is one row.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections.config_dict import placeholder

from bertjax import files
from bertjax.models.heads import BertForTokenClassification
from bertjax.tasks import metrics
from bertjax.tasks import tag_schemes as tagging
from bertjax.tasks.base import Task, TaskSet, register
from bertjax.tasks.features import (Features, HeadFinder, LabelVocab, Packer, WordEncoder,
                                    joined_to_previous, max_context_window, stack, windows)

log = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"


@dataclasses.dataclass
class TaggedSentence:
    guid: str  # file:line of its first token
    words: list[str]
    tags: list[str] | None = None


def read_conll(path: str, scheme: str | None = None, labelled: bool = True,
               strict: bool = False, kind: str | None = None) -> list[TaggedSentence]:
    """Sentences of a CoNLL-style file; `labelled=False` reads token-only files (for predict).
    `kind` is the tags' kind (tag_schemes.KINDS; None: detected from this file's tags),
    `scheme` an entity scheme (BIO/BIOES; None: detected)."""
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
                tags.append(fields[-1])
            words.append(fields[0])
            lines.append(line_num)
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    if labelled:
        kind = kind or _detect_kind(path, sentences)
        if kind == "entity":
            _check_entity_tags(path, sentences)
            _check_scheme(path, sentences, scheme, strict)
        elif kind == "segmentation":
            _check_segmentation(path, sentences, strict)
        elif kind != "plain":
            raise ValueError(f"task.scheme {kind!r}: expected one of {', '.join(tagging.KINDS)}")
    return [s for s, _ in sentences]


def _detect_kind(path: str, sentences) -> str:
    tags = [t for s, _ in sentences for t in s.tags]
    mixed = tagging.mixed_kinds(tags)
    if mixed:
        line_of = [line for _, lines in sentences for line in lines]
        entity, plain = mixed
        raise ValueError(f"{path}:{line_of[plain]}: tag {tags[plain]!r} is not an entity tag, "
                         f"but line {line_of[entity]} holds the entity tag {tags[entity]!r}: a "
                         f"file holds "
                         f"one kind of tags; set task.scheme=plain to read every tag as a "
                         f"class of its own")
    return tagging.detect_kind(tags)


def _check_entity_tags(path: str, sentences) -> None:
    for sentence, lines in sentences:
        for tag, line_num in zip(sentence.tags, lines):
            try:
                tagging.parse_tag(tag)
            except ValueError as e:
                raise ValueError(f"{path}:{line_num}: {e} (task.scheme=entity; set it to "
                                 f"plain for classes such as part-of-speech tags)") from None


def _check_scheme(path: str, sentences, scheme: str | None, strict: bool) -> None:
    found = tagging.detect_scheme(t for s, _ in sentences for t in s.tags)
    scheme = scheme or found
    if scheme not in tagging.SCHEMES:
        raise ValueError(f"tag scheme {scheme!r}: expected one of {', '.join(tagging.SCHEMES)}")
    if scheme == "BIO" and found == "BIOES":
        raise ValueError(f"{path}: holds E-/S- tags but the scheme is BIO")
    _repair(path, sentences, scheme, lambda tags: tagging.canonical(tags, scheme), strict)


def _check_segmentation(path: str, sentences, strict: bool) -> None:
    try:
        scheme = tagging.segmentation_scheme(t for s, _ in sentences for t in s.tags)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    _repair(path, sentences, scheme, lambda tags: tagging.segmentation_tags(
        (b - a for a, b in tagging.word_spans(tags)), scheme), strict)


def _repair(path: str, sentences, scheme: str, canonical, strict: bool) -> None:
    """Re-encodes every sentence as its metric decodes it; counts, logs (or, strict, raises
    on) the tags that change."""
    repaired, first = 0, None
    for sentence, lines in sentences:
        fixed = canonical(sentence.tags)
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
                     label_vocab: LabelVocab | None = None,
                     stride: int | None = None) -> Features:
    """input_ids / input_mask / segment_ids / label_ids [N, L] (label_ids only with tags),
    example_index [N] and word_ids [N, L] (the word whose label sits there, else -1).
    Windows over long sentences start `stride` pieces apart (default: half a row)."""
    packer = Packer(tokenizer, max_seq_length)
    encode, find_head = WordEncoder(tokenizer), HeadFinder(tokenizer)
    budget = max_seq_length - 2
    stride = stride or max(1, budget // 2)
    has_tags = bool(sentences) and all(s.tags is not None for s in sentences)
    if has_tags and label_vocab is None:
        raise ValueError("tags need a label vocabulary (from the training set)")
    rows, windowed = [], 0
    for index, sentence in enumerate(sentences):
        tag_ids = ([label_vocab.id(t, sentence.guid) for t in sentence.tags] if has_tags
                   else [-1] * len(sentence.words))
        doc, doc_labels, doc_words = [], [], []
        for w, pieces in enumerate(encode(sentence.words, joined_to_previous(sentence.words))):
            head = find_head(pieces)
            doc += pieces
            doc_labels += [-1] * head + [tag_ids[w]] + [-1] * (len(pieces) - head - 1)
            doc_words += [-1] * head + [w] + [-1] * (len(pieces) - head - 1)
        spans = [(0, len(doc))] if len(doc) <= budget else windows(len(doc), budget, stride)
        windowed += len(spans) > 1
        best = max_context_window(spans, len(doc))
        for k, (start, length) in enumerate(spans):
            scored = best[start:start + length] == k  # each word in one window only
            ids, mask, segments = packer.pack(doc[start:start + length])
            pad = max_seq_length - length - 1
            rows.append((ids, mask, segments,
                         _row(np.where(scored, doc_labels[start:start + length], -1), pad),
                         np.int32(index),
                         _row(np.where(scored, doc_words[start:start + length], -1), pad)))
    names = ["input_ids", "input_mask", "segment_ids", "label_ids", "example_index", "word_ids"]
    arrays = stack(rows, names)
    if not has_tags:
        del arrays["label_ids"]
    if windowed:
        log.info("%d of %d sentences longer than %d tokens are read in windows %d tokens apart",
                 windowed, len(sentences), max_seq_length, stride)
    return Features(arrays, {"examples": len(sentences), "windowed": windowed})


def _row(values: Sequence[int], pad: int) -> np.ndarray:
    """-1 at [CLS], the values, then -1 at [SEP] and the padding."""
    return np.array([-1, *values] + [-1] * pad, np.int32)


def word_predictions(features: Features, predicted_NL: np.ndarray,
                     sentences: Sequence[TaggedSentence]) -> list[np.ndarray]:
    """Per sentence, the predicted id of each word (read at its first sub-token), or with
    [N, L, C] scores, the scores of each word (-1, or NaN for scores, where a word has no
    prediction)."""
    predicted_NL = np.asarray(predicted_NL)
    missing = np.nan if predicted_NL.dtype.kind == "f" else -1
    out = [np.full((len(s.words), *predicted_NL.shape[2:]), missing, predicted_NL.dtype)
           for s in sentences]
    example_index, word_ids = features.arrays["example_index"], features.arrays["word_ids"]
    for row in range(len(features)):
        at = word_ids[row] >= 0
        out[example_index[row]][word_ids[row][at]] = predicted_NL[row][at]
    return out


class TagKind:
    """What one kind of tags (`task.scheme`) makes of the model's outputs: what evaluation
    fetches, the predicted tags of a sentence's words, the scores, the prediction records and
    how `predict` prints them. Entity tags are the base: argmax tags scored as spans."""

    name = "entity"
    best_metric = "f1"

    def fetch(self, logits_BLC):
        return jnp.argmax(logits_BLC, axis=-1).astype(jnp.int32)

    def words_of(self, text: str) -> list[str]:
        return words_of(text)

    def learn(self, train_examples: list) -> None:
        """What the kind keeps of the training set (segmentation: its words)."""

    def predicted_tags(self, outputs_W, labels: Sequence[str]) -> list[str | None]:
        return [labels[i] if i >= 0 else None for i in outputs_W]

    def scores(self, gold, predicted, examples) -> dict:
        # The span decoders read a missing prediction as outside any entity.
        entity = metrics.entity_scores(gold, [[p or "O" for p in ps] for ps in predicted])
        return {**{k: entity[k] for k in ("precision", "recall", "f1")},
                "token_accuracy": _token_accuracy(gold, predicted)}

    def record(self, sentence: TaggedSentence, tags: list) -> dict:
        record = {"guid": sentence.guid, "words": sentence.words}
        if sentence.tags is not None:
            record["tags"] = sentence.tags
        record["predictions"] = tags
        return record

    def format(self, record: dict) -> str:
        words, tags = record["words"], record["predictions"]
        out, entities = [], {first: (kind, last) for kind, first, last
                             in tagging.entities([t or "O" for t in tags])}
        i = 0
        while i < len(words):
            if i in entities:
                kind, last = entities[i]
                out.append(f"[{' '.join(words[i:last + 1])}]{kind}")
                i = last + 1
            else:
                out.append(words[i])
                i += 1
        return " ".join(out)


class PlainTags(TagKind):
    """Classes of their own (part of speech): token accuracy with per-tag P/R/F1."""

    name = "plain"
    best_metric = "token_accuracy"

    def scores(self, gold, predicted, examples) -> dict:
        return metrics.tag_scores(gold, predicted)

    def format(self, record: dict) -> str:
        return " ".join(f"{w}/{t}" for w, t in zip(record["words"], record["predictions"]))


class SegmentationTags(TagKind):
    """Character tags marking words (BMES/BIES): decoded a whole sentence at a time by
    Viterbi over well-formed tag sequences, scored as words (out-of-vocabulary recall against
    the training set's words)."""

    name = "segmentation"

    def __init__(self):
        self.known_words: set[str] | None = None

    def fetch(self, logits_BLC):
        return jax.nn.log_softmax(logits_BLC.astype(jnp.float32), axis=-1)

    def words_of(self, text: str) -> list[str]:
        return characters_of(text)

    def learn(self, train_examples: list) -> None:
        self.known_words = {w for s in train_examples for w in segmented_words(s.words, s.tags)}

    def predicted_tags(self, outputs_WC, labels: Sequence[str]) -> list[str | None]:
        return _segmentation(outputs_WC, labels)

    def scores(self, gold, predicted, examples) -> dict:
        # A character without a prediction is read as a word of its own.
        scores = metrics.word_scores(gold, [[p or "S" for p in ps] for ps in predicted],
                                     self.known_words, [s.words for s in examples])
        return {**scores, "token_accuracy": _token_accuracy(gold, predicted)}

    def record(self, sentence: TaggedSentence, tags: list) -> dict:
        record = {"guid": sentence.guid, "text": "".join(sentence.words)}
        if sentence.tags is not None:
            record["words"] = segmented_words(sentence.words, sentence.tags)
        record["predictions"] = segmented_words(sentence.words, [t or "S" for t in tags])
        record["predicted_tags"] = tags
        return record

    def format(self, record: dict) -> str:
        return " ".join(record["predictions"])


TAG_KINDS = {kind.name: kind for kind in (TagKind, PlainTags, SegmentationTags)}
assert tuple(TAG_KINDS) == tagging.KINDS


def _token_accuracy(gold, predicted) -> float:
    correct = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs))
    return correct / sum(len(g) for g in gold)


@register
class Tagging(Task):
    """Tags words of CoNLL files; what the tags are (task.scheme, a TagKind) decides the
    metrics and how predictions print: entity-level P/R/F1 (entity), token accuracy with
    per-tag P/R/F1 (plain), word-level P/R/F1 of the segmentation the character tags mark
    (segmentation)."""

    name = "tagging"
    command = "tag"
    targets = ("label_ids",)
    higher_is_better = ("f1", "precision", "recall", "token_accuracy", "macro_f1")
    uses_labels = True
    packable = True
    saved_settings = ("max_seq_length", "doc_stride", "tag_scheme", "scheme")

    @classmethod
    def own_settings(cls) -> dict:
        return {
            # What the tags are: entity (BIO/BIOES spans: NER, chunks) | plain (classes: part
            # of speech) | segmentation (BMES/BIES character tags: Chinese word segmentation);
            # None detects it from the training file.
            "scheme": placeholder(str),
            "tag_scheme": placeholder(str),  # entity tags: BIO | BIOES; None detects it
            "strict_tags": False,  # a tag breaking the scheme is an error, not a repair
            # Windows over sentences longer than a row start doc_stride tokens apart.
            "doc_stride": 128,
        }

    def __init__(self, settings):
        super().__init__(settings)
        if settings.scheme is not None and settings.scheme not in TAG_KINDS:
            raise ValueError(f"task.scheme {settings.scheme!r}: expected one of "
                             f"{', '.join(TAG_KINDS)} (unset: detected from the tags)")
        if settings.tag_scheme is not None and settings.tag_scheme not in tagging.SCHEMES:
            raise ValueError(f"task.tag_scheme {settings.tag_scheme!r}: expected one of "
                             f"{', '.join(tagging.SCHEMES)} (unset: detected from the tags)")
        # Configured, or detected from the training set once it is read (models exported
        # before there were kinds tag entities).
        self.tags: TagKind = TAG_KINDS[settings.scheme or "entity"]()

    @property
    def kind(self) -> str:
        return self.tags.name

    @property
    def best_metric(self) -> str:
        return self.tags.best_metric

    def read(self, path: str, labelled: bool) -> list[TaggedSentence]:
        s = self.settings
        if s.format and s.format != "conll":
            raise ValueError(f"{path}: task.type {self.name} reads conll files, not {s.format}")
        return read_conll(path, scheme=s.tag_scheme, labelled=labelled, strict=s.strict_tags,
                          kind=s.scheme)

    def label_vocab(self, train_examples: list) -> LabelVocab:
        if self.settings.scheme is None:
            self.tags = TAG_KINDS[tagging.detect_kind(t for s in train_examples
                                                      for t in s.tags)]()
        self.tags.learn(train_examples)
        return tag_vocab(train_examples)

    def saved(self) -> dict:
        return {**super().saved(), "scheme": self.kind}

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        return tagging_features(examples, tokenizer, self.settings.max_seq_length, labels,
                                self.settings.doc_stride)

    def examples_from_texts(self, texts, context: str = "") -> list[TaggedSentence]:
        return [TaggedSentence(f"text{i}", self.tags.words_of(t)) for i, t in enumerate(texts)]

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
        return self.tags.fetch(logits_BLC)

    def evaluate(self, taskset: TaskSet, outputs, labels: LabelVocab):
        words = word_predictions(taskset.features, outputs, taskset.examples)
        # A word without a prediction (none: windows cover every word) would count as wrong.
        predicted = [self.tags.predicted_tags(w, labels.labels) for w in words]
        unscored = sum(p is None for ps in predicted for p in ps)
        if unscored:
            log.warning("%s: %d words have no prediction; they count as errors", taskset.name,
                        unscored)
        scores = {}
        if taskset.labelled:
            scores = self.tags.scores([s.tags for s in taskset.examples], predicted,
                                      taskset.examples)
            if self.kind != "entity":
                scores["unscored_words"] = unscored
        return scores, [self.tags.record(s, tags) for s, tags in zip(taskset.examples,
                                                                       predicted)]

    def format_record(self, record: dict) -> str:
        return self.tags.format(record)


def _segmentation(log_probs_WC: np.ndarray, labels: Sequence[str]) -> list[str | None]:
    """The best well-formed tags of one sentence; None for characters without a prediction,
    which the decoding takes as uninformative."""
    missing = np.isnan(log_probs_WC).all(axis=-1)
    tags = tagging.best_segmentation(np.where(missing[:, None], 0.0, log_probs_WC), labels)
    return [None if m else t for t, m in zip(tags, missing)]


def segmented_words(characters: Sequence[str], tags: Sequence[str]) -> list[str]:
    """The words that segmentation tags mark over `characters`."""
    return ["".join(characters[a:b]) for a, b in tagging.word_spans(tags)]


_WORD_SPLIT = re.compile(r"\S+")


def words_of(text: str) -> list[str]:
    """Whitespace words of raw text, for tagging free text (`predict --text`)."""
    return _WORD_SPLIT.findall(text)


def characters_of(text: str) -> list[str]:
    """The characters of raw text to segment, whitespace left out."""
    return [c for c in text if not c.isspace()]
