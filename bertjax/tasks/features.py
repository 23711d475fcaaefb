"""What the task readers share: label vocabularies, cached word encoding, packing token ids
into the fixed-length `input_ids / input_mask / segment_ids` arrays BERT takes, and the
overlapping windows that cover a text longer than one row."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Sequence

import numpy as np

from bertjax import files
from bertjax.data.tokenizers import is_cjk_ideograph

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


def written_unspaced(char: str) -> bool:
    """Characters of scripts written without spaces between words (CJK ideographs, kana, and
    the CJK and fullwidth punctuation that sits among them)."""
    cp = ord(char)
    return (is_cjk_ideograph(cp) or 0x3040 <= cp <= 0x30FF or 0x3000 <= cp <= 0x303F
            or 0xFF00 <= cp <= 0xFFEF)


def joined_to_previous(words: Sequence[str]) -> list[bool]:
    """For tokens read without their original text (CoNLL files, one character a line): which
    ones the text wrote straight after the previous one, with no space. Only scripts written
    without spaces do (Chinese characters, kana and their punctuation); a word of any other
    script is taken to follow a space."""
    return [i > 0 and bool(words[i - 1]) and bool(word) and written_unspaced(words[i - 1][-1])
            and written_unspaced(word[0]) for i, word in enumerate(words)]


class WordEncoder:
    """Token ids of single words, each distinct word encoded once (words repeat a lot).

    A word is encoded as it reads in running text: after a space (the default), or `joined`
    to the previous word. The two differ only for tokenizers that mark word starts:
    SentencePiece encodes a lone Chinese character as the bare word-start piece and the
    character ('京' -> '▁', '京'), but the same character inside a sentence as the character's
    own piece ('京'), which is what the model saw in pretraining.

    A word the tokenizer maps to nothing (control characters only) becomes [UNK], so every
    word owns at least one position and can be tagged or pointed at.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._cache: dict[tuple[str, bool], list[int]] = {}

    def __call__(self, words: Sequence[str],
                 joined: Sequence[bool] | None = None) -> list[list[int]]:
        keys = list(zip(words, joined if joined is not None else [False] * len(words)))
        new = [k for k in dict.fromkeys(keys) if k not in self._cache]
        for flag, encode in ((False, self._tokenizer.encode_batch),
                             (True, self._tokenizer.encode_batch_unspaced)):
            texts = [w for w, j in new if j == flag]
            if texts:
                for word, ids in zip(texts, encode(texts)):
                    self._cache[word, flag] = list(ids) or [self._tokenizer.unk_id]
        return [self._cache[k] for k in keys]


class HeadFinder:
    """Where in a word's pieces its label goes: the first piece that carries some of the word.

    That is the first piece, except after a bare word-start piece (SentencePiece's '▁' alone,
    which it emits before a word it holds no '▁word' piece for): every such word would put
    its label on the same '▁' and the model could not tell the words apart.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._bare: dict[int, bool] = {}

    def __call__(self, ids: Sequence[int]) -> int:
        if len(ids) < 2:
            return 0
        first = ids[0]
        if first not in self._bare:
            self._bare[first] = not self._tokenizer.decode([first]).strip()
        return 1 if self._bare[first] else 0


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


def windows(num_tokens: int, budget: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of windows of at most `budget` tokens, starts `stride` apart, the last
    ending at the end of the text."""
    found, start = [], 0
    while True:
        length = min(num_tokens - start, budget)
        found.append((start, length))
        if start + length >= num_tokens:
            return found
        start += min(length, stride)


def max_context_window(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each token, the window where it has the most context on its shorter side (ties to
    the longer window, then the earlier one)."""
    best_score = np.full(num_tokens, -np.inf)
    best = np.zeros(num_tokens, np.int32)
    for w, (start, length) in enumerate(spans):
        pos = np.arange(start, start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = score > best_score[pos]
        best_score[pos[better]] = score[better]
        best[pos[better]] = w
    return best
