"""Sentence and sentence-pair tasks: classification (SST-2, MRPC, MNLI, ...) and regression
(STS-B), with a dense layer on the pooled [CLS].

Files: GLUE-style TSV (read with no quoting at all, as the GLUE files are written), CSV
(standard quoting) and JSONL (one object per line), with the text and label columns named (or
numbered when a file has no header); or a prepared TFDS GLUE dataset by name.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.models.heads import BertForSequenceClassification
from bertjax.tasks import metrics, tables
from bertjax.tasks.base import Task, TaskSet, example_sum, register
from bertjax.tasks.features import Features, LabelVocab, Packer, stack

log = logging.getLogger(__name__)



@dataclasses.dataclass
class TextExample:
    guid: str  # where it came from ("train.tsv:12"), for messages and prediction files
    text_a: str
    text_b: str | None = None
    label: str | float | None = None  # class name, or the score of a regression task


def read_table(path: str, text_columns: Sequence[tables.Column],
               label_column: tables.Column | None = None,
               fmt: str | None = None, header: bool = True,
               regression: bool = False) -> list[TextExample]:
    """Examples from a TSV / CSV / JSONL file: one or two text columns and an optional label.

    Columns are header names, or 0-based positions (the only choice when `header` is false).
    JSONL lines are objects and columns are their keys. Labels are kept as strings (class
    names) unless `regression`, when they must parse as numbers.
    """
    if not 1 <= len(text_columns) <= 2:
        raise ValueError(f"text_columns {list(text_columns)}: expected one or two columns")
    if fmt is None:
        fmt = tables.format_of(path)
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the format from the extension; pass fmt as "
                             f"one of tsv, csv, jsonl")
    columns = [*text_columns] + ([label_column] if label_column is not None else [])
    examples = []
    for where, values in tables.rows(path, fmt, columns, header):
        texts = [tables.text(values[c], where, c) for c in text_columns]
        label = None
        if label_column is not None:
            label = _label(values[label_column], where, label_column, regression)
        examples.append(TextExample(where, texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def _label(value, where: str, column: tables.Column, regression: bool) -> str | float:
    if regression:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: label column {column!r} is {value!r}, expected a "
                             f"number (regression)") from None
    if isinstance(value, (dict, list)) or value is None:
        raise ValueError(f"{where}: label column {column!r} is {value!r}, expected a class")
    return str(value).strip()


# --- TFDS -----------------------------------------------------------------------------------

# name -> (text features, label feature, regression); SQuAD is read by squad.py.
TFDS_TEXT_TASKS = {
    "glue/cola": (("sentence",), "label", False),
    "glue/sst2": (("sentence",), "label", False),
    "glue/mrpc": (("sentence1", "sentence2"), "label", False),
    "glue/qqp": (("question1", "question2"), "label", False),
    "glue/stsb": (("sentence1", "sentence2"), "label", True),
    "glue/mnli": (("premise", "hypothesis"), "label", False),
    "glue/qnli": (("question", "sentence"), "label", False),
    "glue/rte": (("sentence1", "sentence2"), "label", False),
}


def read_tfds(name: str, split: str, data_dir: str | None = None) -> list[TextExample]:
    """TextExamples of a prepared TFDS GLUE dataset.

    Class labels become their names (e.g. 'negative'/'positive'); GLUE test splits carry no
    labels (-1) and give label None.
    """
    if name not in TFDS_TEXT_TASKS:
        raise ValueError(f"TFDS dataset {name!r}: expected one of {', '.join(TFDS_TEXT_TASKS)}")
    builder, rows = tables.tfds_rows(name, split, data_dir)
    text_keys, label_key, regression = TFDS_TEXT_TASKS[name]
    label_names = None if regression else builder.info.features[label_key].names
    examples = []
    for i, row in enumerate(rows):
        texts = [row[k].decode("utf-8") for k in text_keys]
        value = row[label_key]
        if regression:
            label = float(value)
        else:
            label = label_names[int(value)] if value >= 0 else None
        examples.append(TextExample(f"tfds:{name}/{split}:{i}", texts[0],
                                    texts[1] if len(texts) > 1 else None, label))
    return examples


def read_task_table(settings, task_name: str, path: str, labelled: bool,
                    regression: bool = False) -> list[TextExample]:
    """Sentence (pair) examples of a table as `tables.settings` describe it."""
    fmt = tables.task_format(settings, task_name, path)
    columns = [tables.column(c, settings.header) for c in settings.text_columns]
    return read_table(path, columns, settings.label_column if labelled else None, fmt=fmt,
                      header=settings.header, regression=regression)


# --- features -------------------------------------------------------------------------------


def classification_features(examples: Sequence[TextExample], tokenizer, max_seq_length: int,
                            label_vocab: LabelVocab | None = None,
                            regression: bool = False) -> Features:
    """input_ids / input_mask / segment_ids [N, L] and `label` [N] (int32 class id, or float32
    score when `regression`) when every example has a label.

    Over-long inputs are truncated as the original does: one token at a time from the end of
    the longer text, so a short first sentence keeps all its tokens.
    """
    labelled = [e.label is not None for e in examples]
    if any(labelled) and not all(labelled):
        where = examples[labelled.index(False)].guid
        raise ValueError(f"{where}: example without a label among labelled ones")
    has_labels = bool(examples) and all(labelled)
    if has_labels and not regression and label_vocab is None:
        raise ValueError("classification labels need a label vocabulary (from the training set)")

    packer = Packer(tokenizer, max_seq_length)
    ids_a = tokenizer.encode_batch([e.text_a for e in examples])
    pairs = [e.text_b is not None for e in examples]
    ids_b = tokenizer.encode_batch([e.text_b for e in examples if e.text_b is not None])
    ids_b_iter = iter(ids_b)
    rows, truncated = [], 0
    for example, a, is_pair in zip(examples, ids_a, pairs):
        b = next(ids_b_iter) if is_pair else None
        a, b, cut = _truncate(list(a), None if b is None else list(b), max_seq_length)
        truncated += cut
        row = packer.pack(a, b)
        if has_labels:
            label = (np.float32(example.label) if regression
                     else np.int32(label_vocab.id(example.label, example.guid)))
            row = (*row, label)
        rows.append(row)
    names = ["input_ids", "input_mask", "segment_ids"] + (["label"] if has_labels else [])
    stats = {"examples": len(examples), "truncated": truncated}
    if truncated:
        log.info("%d of %d examples truncated to %d tokens", truncated, len(examples),
                 max_seq_length)
    return Features(stack(rows, names), stats)


def _truncate(a: list[int], b: list[int] | None, max_seq_length: int):
    budget = max_seq_length - (3 if b is not None else 2)
    if b is None:
        return a[:budget], None, int(len(a) > budget)
    cut = len(a) + len(b) > budget
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()
    return a, b, int(cut)


# --- the tasks ------------------------------------------------------------------------------


def _record(example: TextExample) -> dict:
    record = {"guid": example.guid, "text_a": example.text_a}
    if example.text_b is not None:
        record["text_b"] = example.text_b
    if example.label is not None:
        record["label"] = example.label
    return record


@register
class Classification(Task):
    name = "classification"
    command = "classify"
    targets = ("label",)
    best_metric = "accuracy"
    higher_is_better = ("accuracy", "macro_f1", "mcc", "f1")
    uses_labels = True
    regression = False
    packable = True

    @classmethod
    def own_settings(cls) -> dict:
        return tables.settings()

    def read(self, path: str, labelled: bool) -> list[TextExample]:
        return read_task_table(self.settings, self.name, path, labelled, self.regression)

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list:
        return read_tfds(name, split, data_dir)

    def label_vocab(self, train_examples: list) -> LabelVocab:
        return LabelVocab.from_labels(e.label for e in train_examples)

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        return classification_features(examples, tokenizer, self.settings.max_seq_length,
                                       labels, regression=self.regression)

    def examples_from_texts(self, texts, context: str = "") -> list[TextExample]:
        examples = []
        for i, text in enumerate(texts):
            a, _, b = text.partition("\t")  # a TAB separates a sentence pair
            examples.append(TextExample(f"text{i}", a, b if b else None))
        return examples

    def model(self, config, labels: LabelVocab):
        return BertForSequenceClassification(config, len(labels))

    def loss_sum(self, logits_BC, batch):
        # Packed rows: [B, E, C] logits and [B, E] labels.
        labels_B = batch["label"].astype(jnp.int32)
        return example_sum(optax.softmax_cross_entropy_with_integer_labels(logits_BC, labels_B),
                           batch)

    def fetch(self, logits_BC):
        return jax.nn.softmax(logits_BC, axis=-1)

    def evaluate(self, taskset: TaskSet, probs_NC, labels: LabelVocab):
        scores = {}
        if taskset.labelled:
            gold, pred = taskset.features.arrays["label"], probs_NC.argmax(-1)
            scores = {"accuracy": metrics.accuracy(pred, gold),
                      "macro_f1": metrics.f1(pred, gold, "macro"),
                      "mcc": metrics.matthews_corrcoef(pred, gold)}
            if len(labels) == 2:
                scores["f1"] = metrics.f1(pred, gold, positive=1)
        records = []
        for example, probs in zip(taskset.examples, probs_NC):
            best = int(probs.argmax())
            records.append({**_record(example), "prediction": labels.labels[best],
                            "probability": float(probs[best]),
                            "probabilities": {l: float(p) for l, p in zip(labels.labels, probs)}})
        return scores, records

    def format_record(self, record: dict) -> str:
        text = record["text_a"] + (f" | {record['text_b']}" if "text_b" in record else "")
        return f"{record['prediction']}  {record['probability']:.3f}  {text}"


@register
class Regression(Classification):
    name = "regression"
    targets = ("label",)
    best_metric = "pearson"
    higher_is_better = ("pearson", "spearman")
    uses_labels = False
    regression = True

    def label_vocab(self, train_examples: list) -> None:
        return None

    def model(self, config, labels):
        return BertForSequenceClassification(config, 1)

    def loss_sum(self, logits_B1, batch):
        return example_sum(jnp.square(logits_B1[..., 0] - batch["label"].astype(jnp.float32)),
                           batch)

    def fetch(self, logits_B1):
        return logits_B1[:, 0]

    def evaluate(self, taskset: TaskSet, scores_N, labels):
        scores = {}
        if taskset.labelled:
            gold = taskset.features.arrays["label"]
            scores = {"pearson": metrics.pearson(scores_N, gold),
                      "spearman": metrics.spearman(scores_N, gold),
                      "mse": float(np.mean(np.square(scores_N - gold)))}
        records = [{**_record(e), "prediction": float(score)}
                   for e, score in zip(taskset.examples, scores_N)]
        return scores, records

    def format_record(self, record: dict) -> str:
        text = record["text_a"] + (f" | {record['text_b']}" if "text_b" in record else "")
        return f"{record['prediction']:.4f}  {text}"
