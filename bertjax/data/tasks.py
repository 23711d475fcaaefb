"""Fine-tuning inputs for sentence and sentence-pair tasks, and TFDS datasets by name.

Files: GLUE-style TSV (read with no quoting at all, as the GLUE files are written), CSV
(standard quoting) and JSONL (one object per line), with the text and label columns named (or
numbered when a file has no header). Token tagging files are read by `conll.py`, SQuAD by
`squad.py`. Featurisation takes any `bertjax.data.tokenizers.Tokenizer`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from typing import Sequence

import numpy as np

from bertjax.data.features import Features, LabelVocab, Packer, stack

log = logging.getLogger(__name__)

FORMATS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}

Column = str | int


@dataclasses.dataclass
class TextExample:
    guid: str  # where it came from ("train.tsv:12"), for messages and prediction files
    text_a: str
    text_b: str | None = None
    label: str | float | None = None  # class name, or the score of a regression task


def read_table(path: str, text_columns: Sequence[Column], label_column: Column | None = None,
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
        fmt = FORMATS.get(os.path.splitext(path)[1].lower())
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the format from the extension; pass fmt as "
                             f"one of tsv, csv, jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    columns = [*text_columns] + ([label_column] if label_column is not None else [])
    rows = _json_rows(path, columns) if fmt == "jsonl" else _delimited_rows(path, fmt, columns,
                                                                              header)
    examples = []
    for where, values in rows:
        texts = [_text(values[c], where, c) for c in text_columns]
        label = None
        if label_column is not None:
            label = _label(values[label_column], where, label_column, regression)
        examples.append(TextExample(where, texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def _delimited_rows(path: str, fmt: str, columns: list[Column], header: bool):
    if fmt not in ("tsv", "csv"):
        raise ValueError(f"format {fmt!r}: expected one of tsv, csv, jsonl")
    name = os.path.basename(path)
    dialect = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv" else {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, **dialect)
        names = None
        for row in reader:
            if not any(field.strip() for field in row):
                continue
            if names is None:
                names = row if header else [str(i) for i in range(len(row))]
                index = _column_index(path, names, columns, header)
                if header:
                    continue
            if len(row) != len(names):
                raise ValueError(f"{path}:{reader.line_num}: {len(row)} fields, expected "
                                 f"{len(names)} ({'as the header' if header else 'as line 1'})")
            yield f"{name}:{reader.line_num}", {c: row[i] for c, i in index.items()}


def _column_index(path: str, names: list[str], columns: list[Column], header: bool) -> dict:
    index = {}
    for c in columns:
        if isinstance(c, int) and 0 <= c < len(names):
            index[c] = c
        elif header and c in names:
            index[c] = names.index(c)
        else:
            has = (f"columns {names}" if header
                   else f"no header, so name columns by position 0..{len(names) - 1}")
            raise ValueError(f"{path}: no column {c!r}; it has {has}")
    return index


def _json_rows(path: str, columns: list[Column]):
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        for line_num, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_num}: not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{line_num}: expected a JSON object per line")
            missing = [c for c in columns if c not in obj]
            if missing:
                raise ValueError(f"{path}:{line_num}: no column {missing[0]!r}; it has "
                                 f"columns {sorted(obj)}")
            yield f"{name}:{line_num}", obj


def _text(value, where: str, column: Column) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} is {value!r}, expected text")
    return value


def _label(value, where: str, column: Column, regression: bool) -> str | float:
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
TFDS_SQUAD = ("squad", "squad/v1.1", "squad/v2.0")


def read_tfds(name: str, split: str, data_dir: str | None = None) -> list:
    """TextExamples (GLUE tasks) or SquadExamples (squad) of a prepared TFDS dataset.

    Class labels become their names (e.g. 'negative'/'positive'); GLUE test splits carry no
    labels (-1) and give label None.
    """
    if name not in TFDS_TEXT_TASKS and name not in TFDS_SQUAD:
        raise ValueError(f"TFDS dataset {name!r}: expected one of "
                         f"{', '.join([*TFDS_TEXT_TASKS, *TFDS_SQUAD])}")
    import tensorflow_datasets as tfds  # only for users who read TFDS

    builder = tfds.builder(name, data_dir=data_dir)
    try:
        dataset = builder.as_dataset(split=split)
    except AssertionError:
        raise FileNotFoundError(
            f"TFDS dataset {name} is not prepared under {builder.data_dir}: build it where "
            f"there is internet (`tfds build {name}`) and pass its data_dir") from None
    rows = tfds.as_numpy(dataset)
    if name in TFDS_SQUAD:
        from bertjax.data.squad import squad_examples_from_tfds
        return squad_examples_from_tfds(rows, f"tfds:{name}/{split}")
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
