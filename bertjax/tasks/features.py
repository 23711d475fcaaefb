"""What the task readers share: label vocabularies, cached word encoding, and packing token
ids into the fixed-length `input_ids / input_mask / segment_ids` arrays BERT takes."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Sequence

import numpy as np

from bertjax import files

LABELS_FILE = "labels.json"


@dataclasses.dataclass
class Features:
    """Fixed-length arrays, one row per feature, and counts worth telling the user.

    Model inputs are `input_ids`, `input_mask`, `segment_ids` (int32 [N, L]); targets and the
    maps back to examples (`example_index`, ...) sit in the same dict.
    """

    arrays: dict[str, np.ndarray]
    stats: dict[str, int]

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])


class LabelVocab:
    """Label strings <-> ids, fixed by the training set and saved next to the model."""

    def __init__(self, labels: Sequence[str]):
        if len(set(labels)) != len(labels) or not labels:
            raise ValueError(f"labels {list(labels)}: expected distinct labels, at least one")
        self.labels = list(labels)
        self._ids = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def from_labels(cls, labels: Iterable[str], first: str | None = None) -> "LabelVocab":
        """Sorted (numerically when all labels are integers); `first` (e.g. 'O') goes first."""
        distinct = set(labels)
        if all(_is_int(label) for label in distinct):
            ordered = sorted(distinct, key=int)
        else:
            ordered = sorted(distinct)
        if first in distinct:
            ordered = [first] + [label for label in ordered if label != first]
        return cls(ordered)

    def __len__(self) -> int:
        return len(self.labels)

    def __eq__(self, other) -> bool:
        return isinstance(other, LabelVocab) and other.labels == self.labels

    def id(self, label: str, where: str) -> int:
        if label not in self._ids:
            raise ValueError(f"{where}: label {label!r} does not occur in the training data "
                             f"(labels: {', '.join(map(repr, self.labels[:20]))})")
        return self._ids[label]

    def save(self, directory: str) -> str:
        path = os.path.join(directory, LABELS_FILE)
        files.write_json(path, {"labels": self.labels}, indent=1)
        return path

    @classmethod
    def load(cls, directory: str) -> "LabelVocab":
        path = os.path.join(directory, LABELS_FILE)
        if not files.path(path).exists():
            raise FileNotFoundError(f"{path} not found: the label vocabulary is written by "
                                    f"fine-tuning next to the model")
        stored = files.read_json(path)
        if not isinstance(stored, dict) or not isinstance(stored.get("labels"), list):
            raise ValueError(f"{path}: expected {{'labels': [...]}}")
        return cls(stored["labels"])


def _is_int(label: str) -> bool:
    try:
        int(label)
    except ValueError:
        return False
    return True


class WordEncoder:
    """Token ids of single words, each distinct word encoded once (words repeat a lot).

    A word the tokenizer maps to nothing (control characters only) becomes [UNK], so every
    word owns at least one position and can be tagged or pointed at.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def __call__(self, words: Sequence[str]) -> list[list[int]]:
        new = [w for w in dict.fromkeys(words) if w not in self._cache]
        if new:
            for word, ids in zip(new, self._tokenizer.encode_batch(new)):
                self._cache[word] = list(ids) or [self._tokenizer.unk_id]
        return [self._cache[w] for w in words]


class Packer:
    """[CLS] a [SEP] (b [SEP]) into fixed-length rows, padded with the tokenizer's [PAD]."""

    def __init__(self, tokenizer, max_seq_length: int):
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length {max_seq_length}: expected at least 3")
        self.max_seq_length = max_seq_length
        self.cls_id, self.sep_id, self.pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id

    def pack(self, a: Sequence[int], b: Sequence[int] | None = None):
        """(input_ids, input_mask, segment_ids) int32 [L]; the caller has truncated a and b."""
        tokens = [self.cls_id, *a, self.sep_id]
        segments = [0] * len(tokens)
        if b is not None:
            tokens += [*b, self.sep_id]
            segments += [1] * (len(b) + 1)
        if len(tokens) > self.max_seq_length:
            raise ValueError(f"{len(tokens)} tokens do not fit max_seq_length "
                             f"{self.max_seq_length}")
        pad = self.max_seq_length - len(tokens)
        return (np.array(tokens + [self.pad_id] * pad, np.int32),
                np.array([1] * len(tokens) + [0] * pad, np.int32),
                np.array(segments + [0] * pad, np.int32))


def stack(rows: Sequence[tuple], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Rows of per-feature arrays -> one [N, ...] array per name."""
    if not rows:
        raise ValueError("no features: the input has no examples")
    return {name: np.stack([row[i] for row in rows]) for i, name in enumerate(names)}
