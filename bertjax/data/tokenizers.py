"""One Tokenizer interface over WordPiece (BERT vocab.txt) and SentencePiece models."""

from __future__ import annotations

import abc
from typing import Sequence

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class Tokenizer(abc.ABC):
    """Text <-> token ids, without adding special tokens (the pipelines place [CLS]/[SEP])."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[str]: ...

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str: ...

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abc.abstractmethod
    def save(self, directory: str) -> list[str]:
        """Copies the vocabulary file(s) into `directory`; returns the written paths."""

    @abc.abstractmethod
    def word_start_table(self) -> np.ndarray:
        """bool [vocab_size]: True where a token begins a word (for whole-word masking)."""

    @property
    def pad_id(self) -> int:
        return self._special("[PAD]")

    @property
    def unk_id(self) -> int:
        return self._special("[UNK]")

    @property
    def cls_id(self) -> int:
        return self._special("[CLS]")

    @property
    def sep_id(self) -> int:
        return self._special("[SEP]")

    @property
    def mask_id(self) -> int:
        return self._special("[MASK]")

    def special_ids(self) -> dict[str, int]:
        return {t: self._special(t) for t in SPECIAL_TOKENS}

    def _special(self, token: str) -> int:
        token_id = self.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{self!r}: vocabulary has no {token} token; BERT needs "
                             f"all of {', '.join(SPECIAL_TOKENS)}")
        return token_id
