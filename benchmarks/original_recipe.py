"""The offline recipe of google-research/bert `create_pretraining_data.py`, in plain Python.

Our own re-implementation of its logic, used as the speed anchor of `data_pipeline.py`:
pure-Python BERT tokenization (basic + WordPiece), then per document the instance
construction (one target length per document, truncation to max_num_tokens, the random
document drawn with ten tries so it can still be the same one) and per instance the masking
(whole-word candidates optional, 80/10/10 per token), then padding to fixed-length features.
It writes nothing: serializing to TFRecord would only slow it further.
"""

from __future__ import annotations

import random
import unicodedata


def load_vocab(path: str) -> dict[str, int]:
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class FullTokenizer:
    """Lower-casing BERT tokenizer: whitespace/punctuation/CJK split, then greedy WordPiece."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def _basic(self, text: str) -> list[str]:
        chars = []
        for ch in text:
            cp = ord(ch)
            control = unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n\r"
            if cp == 0 or cp == 0xFFFD or control:
                continue
            chars.append(f" {ch} " if _is_cjk(cp) else (" " if ch.isspace() else ch))
        words = []
        for word in "".join(chars).split():
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower())
                           if unicodedata.category(c) != "Mn")
            current = []
            for ch in word:
                if _is_punctuation(ch):
                    if current:
                        words.append("".join(current))
                        current = []
                    words.append(ch)
                else:
                    current.append(ch)
            if current:
                words.append("".join(current))
        return words

    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > 100:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        return [p for w in self._basic(text) for p in self._wordpiece(w)]


def _truncate_pair(a: list, b: list, max_num_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_num_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _mask(tokens: list[str], vocab_words: list[str], rng: random.Random, *, mask_rate: float,
          max_predictions: int, whole_word: bool):
    candidates = []
    for i, token in enumerate(tokens):
        if token in ("[CLS]", "[SEP]"):
            continue
        if whole_word and candidates and token.startswith("##"):
            candidates[-1].append(i)
        else:
            candidates.append([i])
    rng.shuffle(candidates)
    output = list(tokens)
    budget = min(max_predictions, max(1, int(round(len(tokens) * mask_rate))))
    predictions = []
    for index_set in candidates:
        if len(predictions) >= budget:
            break
        if len(predictions) + len(index_set) > budget:
            continue
        for i in index_set:
            if rng.random() < 0.8:
                output[i] = "[MASK]"
            elif rng.random() < 0.5:
                output[i] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            predictions.append((i, tokens[i]))
    predictions.sort()
    return output, predictions


def _instances(documents: list[list[list[str]]], index: int, rng: random.Random, *,
               max_seq_length: int, short_seq_prob: float):
    document = documents[index]
    max_num_tokens = max_seq_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    chunk, length, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                b = []
                is_random = len(chunk) == 1 or rng.random() < 0.5
                if is_random:
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != index:
                            break
                    other_doc = documents[other]
                    for j in range(rng.randint(0, len(other_doc) - 1), len(other_doc)):
                        b.extend(other_doc[j])
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end
                else:
                    b = [t for s in chunk[a_end:] for t in s]
                _truncate_pair(a, b, max_num_tokens, rng)
                if a and b:
                    yield ["[CLS]", *a, "[SEP]", *b, "[SEP]"], len(a) + 2, is_random
            chunk, length = [], 0
        i += 1


def pretraining_features(documents_text: list[list[str]], vocab: dict[str, int], *,
                         max_seq_length: int, max_predictions: int, seed: int = 0,
                         mask_rate: float = 0.15, short_seq_prob: float = 0.1,
                         whole_word: bool = False):
    """Yields one feature dict per instance from documents given as lists of sentence strings."""
    rng = random.Random(seed)
    tokenizer = FullTokenizer(vocab)
    documents = [[t for t in (tokenizer.tokenize(s) for s in doc) if t] for doc in documents_text]
    documents = [d for d in documents if d]
    vocab_words = list(vocab)
    for index in range(len(documents)):
        for tokens, first_b, is_random in _instances(documents, index, rng,
                                                     max_seq_length=max_seq_length,
                                                     short_seq_prob=short_seq_prob):
            masked, predictions = _mask(tokens, vocab_words, rng, mask_rate=mask_rate,
                                        max_predictions=max_predictions, whole_word=whole_word)
            pad = max_seq_length - len(masked)
            pred_pad = max_predictions - len(predictions)
            yield {
                "input_ids": [vocab[t] for t in masked] + [0] * pad,
                "input_mask": [1] * len(masked) + [0] * pad,
                "segment_ids": [0] * first_b + [1] * (len(masked) - first_b) + [0] * pad,
                "masked_lm_positions": [p for p, _ in predictions] + [0] * pred_pad,
                "masked_lm_ids": [vocab[t] for _, t in predictions] + [0] * pred_pad,
                "masked_lm_weights": [1.0] * len(predictions) + [0.0] * pred_pad,
                "next_sentence_labels": int(is_random),
            }
