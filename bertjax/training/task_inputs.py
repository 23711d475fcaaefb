"""What a fine-tuning config's `task` section reads: examples from files or TFDS, the label
vocabulary of the training set, and the features of the training, evaluation and prediction
sets. Every process reads and featurises everything (fine-tuning sets fit in memory) and
later takes its own rows of each batch."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bertjax.data import conll, squad, tasks
from bertjax.data.features import Features, LabelVocab

FILE_FORMATS = ("tsv", "csv", "jsonl", "conll", "squad")


@dataclasses.dataclass
class TaskSet:
    name: str  # file base name or TFDS split: names the predictions file
    examples: list
    features: Features
    labelled: bool


@dataclasses.dataclass
class TaskData:
    train: TaskSet | None
    evals: list[TaskSet]
    predicts: list[TaskSet]
    labels: LabelVocab | None  # None for regression and SQuAD


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _columns(value: str, header: bool) -> list:
    names = _split(value)
    return names if header else [int(n) if n.isdigit() else n for n in names]


def _format(task: Any, path: str) -> str:
    if task.format:
        if task.format not in FILE_FORMATS:
            raise ValueError(f"task.format {task.format!r}: expected one of "
                             f"{', '.join(FILE_FORMATS)}")
        return task.format
    if task.type == "squad":
        return "squad"
    if task.type == "tagging":
        return "conll"
    ext = os.path.splitext(path)[1].lower()
    if ext not in tasks.FORMATS:
        raise ValueError(f"{path}: cannot tell the format from the extension; set task.format "
                         f"to one of {', '.join(FILE_FORMATS)}")
    return tasks.FORMATS[ext]


def read_examples(task: Any, path: str, labelled: bool) -> list:
    """The examples of one file, as `task` describes it."""
    fmt = _format(task, path)
    if fmt == "squad":
        return squad.read_squad(path)
    if fmt == "conll":
        return conll.read_conll(path, scheme=task.tag_scheme or None, labelled=labelled,
                                strict=task.strict_tags)
    if task.type in ("tagging", "squad"):
        wanted = "conll" if task.type == "tagging" else "squad"
        raise ValueError(f"{path}: task.type {task.type} reads {wanted} files, not {fmt}")
    return tasks.read_table(path, _columns(task.text_columns, task.header),
                            task.label_column if labelled else None, fmt=fmt,
                            header=task.header, regression=task.type == "regression")


def featurize(task: Any, examples: list, tokenizer, labels: LabelVocab | None,
              training: bool = False) -> Features:
    if task.type == "squad":
        return squad.squad_features(examples, tokenizer, task.max_seq_length, task.doc_stride,
                                    task.max_query_length, training=training)
    if task.type == "tagging":
        return conll.tagging_features(examples, tokenizer, task.max_seq_length, labels)
    return tasks.classification_features(examples, tokenizer, task.max_seq_length, labels,
                                         regression=task.type == "regression")


def label_vocab(task: Any, train_examples: list) -> LabelVocab | None:
    if task.type == "classification":
        return LabelVocab.from_labels(e.label for e in train_examples)
    if task.type == "tagging":
        return conll.tag_vocab(train_examples)
    return None


def _tfds_sets(task: Any) -> tuple[list, list[tuple[str, list]]]:
    data_dir = task.tfds_data_dir or None
    train = tasks.read_tfds(task.tfds_name, task.tfds_train_split, data_dir)
    evals = [(split, tasks.read_tfds(task.tfds_name, split, data_dir))
             for split in _split(task.tfds_eval_splits)]
    return train, evals


def load_task_data(task: Any, tokenizer) -> TaskData:
    """Reads and featurises the sets the config names; the label vocabulary comes from the
    training set (an evaluation label it lacks is an error naming the file and line)."""
    from bertjax.training.finetune_config import TASK_TYPES
    if task.type not in TASK_TYPES:
        raise ValueError(f"task.type {task.type!r}: expected one of {', '.join(TASK_TYPES)}")
    if task.tfds_name:
        if task.train_file:
            raise ValueError("set task.train_file or task.tfds_name, not both")
        train_examples, eval_examples = _tfds_sets(task)
    else:
        if not task.train_file:
            raise ValueError("task.train_file is empty: set it (or task.tfds_name) to the "
                             "training data")
        train_examples = read_examples(task, task.train_file, labelled=True)
        eval_examples = [(_name(path), read_examples(task, path, labelled=True))
                         for path in _split(task.eval_files)]
    labels = label_vocab(task, train_examples)
    train = TaskSet("train", train_examples,
                    featurize(task, train_examples, tokenizer, labels, training=True), True)
    evals = [TaskSet(name, examples, featurize(task, examples, tokenizer, labels), True)
             for name, examples in eval_examples]
    predicts = []
    for path in _split(task.predict_files):
        examples = read_examples(task, path, labelled=False)
        predicts.append(TaskSet(_name(path), examples,
                                featurize(task, examples, tokenizer, labels), False))
    _check_unique_names(evals + predicts)
    return TaskData(train, evals, predicts, labels)


def _name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _check_unique_names(sets: list[TaskSet]) -> None:
    seen = set()
    for s in sets:
        if s.name in seen:
            raise ValueError(f"two evaluation/prediction sets are named {s.name!r}: their "
                             f"predictions files would collide; rename one file")
        seen.add(s.name)
