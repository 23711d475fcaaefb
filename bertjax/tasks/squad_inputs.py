"""Extractive QA inputs (SQuAD v1.1 and v2.0): examples, and windowed fixed-length features
(the task itself is `squad.py`, the answer search `spans.py`).

The context is split into *words* the way BERT's basic tokenizer splits text (whitespace,
each punctuation mark, each CJK character), each with its character span; WordPiece never
crosses these boundaries, so encoding word by word gives the tokens of the whole text and
every token maps back to a word and so to the original characters. (A SentencePiece model
sees each word on its own, which differs slightly from encoding the whole text.)

Contexts longer than a row are covered by overlapping windows (`doc_stride` apart), as in
the original run_squad: `[CLS] question [SEP] window [SEP]`. Each feature row keeps
`example_index`, `token_to_word` (-1 outside the context) and `token_is_max_context` (this
window gives the token the most surrounding context) for `spans.py` to turn scores back into
answer text. Targets `start_positions`/`end_positions` point at the answer's first and last
token, or at 0 ([CLS]) when the question has no answer or the answer is not in the window.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import logging
import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bertjax import files
from bertjax.data.tokenizers import is_cjk_ideograph
from bertjax.tasks.features import (Features, Packer, WordEncoder, max_context_window, stack,
                                    windows)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list[str]  # every gold answer text; empty for an unanswerable (v2.0) question
    answer_start: int = -1  # character offset of the first answer in context; -1 if unknown
    answer_text: str = ""
    is_impossible: bool = False


def read_squad(path: str) -> list[SquadExample]:
    """Examples of a SQuAD v1.1 or v2.0 JSON file.

    An answer whose text is not at its `answer_start` is looked for elsewhere in the context
    (nearest occurrence); one not found at all leaves `answer_start` -1, and training skips
    that example. Both are counted and logged.
    """
    root = files.read_json(path)
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise ValueError(f"{path}: expected SQuAD JSON, {{'data': [{{'paragraphs': "
                         f"[{{'context': ..., 'qas': [...]}}]}}]}}")
    counts = {"relocated": 0, "not_found": 0}
    examples = []
    try:
        for article in root["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = qa.get("answers", [])  # absent in files to predict
                    examples.append(_example(
                        qa["id"], qa["question"], context, [a["text"] for a in answers],
                        [a["answer_start"] for a in answers],
                        bool(qa.get("is_impossible", False)), counts))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: question {len(examples)}: malformed SQuAD entry (missing or "
                         f"wrong {e})") from None
    _report(path, examples, counts)
    return examples


def squad_examples_from_tfds(rows: Iterable[dict], where: str) -> list[SquadExample]:
    """Examples from TFDS `squad` rows (bytes fields, answers as parallel lists)."""
    counts = {"relocated": 0, "not_found": 0}
    examples = []
    for row in rows:
        texts = [t.decode("utf-8") for t in row["answers"]["text"]]
        examples.append(_example(
            row["id"].decode("utf-8"), row["question"].decode("utf-8"),
            row["context"].decode("utf-8"), texts, [int(s) for s in row["answers"]["answer_start"]],
            bool(row["is_impossible"]) if "is_impossible" in row else False, counts))
    _report(where, examples, counts)
    return examples


def _example(qid, question, context, texts, starts, impossible, counts) -> SquadExample:
    if impossible or not texts:
        # SQuAD v2.0 files list plausible (wrong) answers separately; answers are empty.
        return SquadExample(str(qid), question, context, [], is_impossible=True)
    text, given = texts[0].strip(), starts[0] + len(texts[0]) - len(texts[0].lstrip())
    start = _locate(context, text, given)
    if start is None:
        counts["not_found"] += 1
        start = -1
    elif start != given:
        counts["relocated"] += 1
    return SquadExample(str(qid), question, context, texts, start, text)


def _locate(context: str, text: str, given: int) -> int | None:
    if not text:
        return None
    if context[given:given + len(text)] == text:
        return given
    hits = [m.start() for m in re.finditer(re.escape(text), context)]
    return min(hits, key=lambda h: abs(h - given)) if hits else None


def _report(where: str, examples, counts) -> None:
    if counts["relocated"]:
        log.warning("%s: %d answers were not at their answer_start; used the nearest "
                    "occurrence of their text", where, counts["relocated"])
    if counts["not_found"]:
        log.warning("%s: %d of %d answers are not in their context; training skips those "
                    "questions", where, counts["not_found"], len(examples))


# --- words with character spans -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _char_kind(ch: str) -> int:
    """0 separator (whitespace, control), 1 a word of its own (punctuation, CJK), 2 word part."""
    cp, category = ord(ch), unicodedata.category(ch)
    if ch.isspace() or category in ("Zs", "Cc", "Cf") or cp in (0, 0xFFFD):
        return 0
    if (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or category.startswith("P") or is_cjk_ideograph(cp)):
        return 1
    return 2


@functools.lru_cache(maxsize=256)  # a context is shared by several questions
def context_words(context: str) -> tuple[tuple[int, int], ...]:
    """(start, end) character spans of the context's words, in order."""
    spans, start = [], -1
    for i, ch in enumerate(context):
        kind = _char_kind(ch)
        if kind != 2 and start >= 0:
            spans.append((start, i))
            start = -1
        if kind == 1:
            spans.append((i, i + 1))
        elif kind == 2 and start < 0:
            start = i
    if start >= 0:
        spans.append((start, len(context)))
    return tuple(spans)


# --- features -------------------------------------------------------------------------------

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions",
                 "example_index", "token_to_word", "token_is_max_context")


def squad_features(examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384,
                   doc_stride: int = 128, max_query_length: int = 64,
                   training: bool = False) -> Features:
    """Windowed features of every example; in training, answerable examples whose answer is
    not in the context are skipped (counted in stats['skipped'])."""
    if max_seq_length - max_query_length - 3 < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context "
                         f"after a {max_query_length}-token question")
    packer = Packer(tokenizer, max_seq_length)
    encode = WordEncoder(tokenizer)
    questions = tokenizer.encode_batch([e.question for e in examples])
    rows, context = [], None
    stats = {"examples": len(examples), "skipped": 0, "answer_outside_window": 0,
             "questions_truncated": 0}
    for index, (example, question) in enumerate(zip(examples, questions)):
        if training and not example.is_impossible and example.answer_start < 0:
            stats["skipped"] += 1
            continue
        stats["questions_truncated"] += len(question) > max_query_length
        query = list(question[:max_query_length])
        if example.context != context:  # questions on one paragraph come together
            context = example.context
            doc, tok_to_word, word_first_tok = _context_tokens(context, encode)
        answer = _answer_tokens(example, doc, word_first_tok, tokenizer)
        budget = max_seq_length - len(query) - 3
        row_windows = windows(len(doc), budget, doc_stride)
        best_window = max_context_window(row_windows, len(doc))
        offset = len(query) + 2
        for w, (start, length) in enumerate(row_windows):
            ids, mask, segments = packer.pack(query, doc[start:start + length])
            pad = max_seq_length - offset - length
            words = np.array([-1] * offset + tok_to_word[start:start + length] + [-1] * pad,
                             np.int32)
            is_max = np.zeros(max_seq_length, bool)
            is_max[offset:offset + length] = best_window[start:start + length] == w
            first, last = 0, 0
            if answer is not None:
                if start <= answer[0] and answer[1] < start + length:
                    first, last = answer[0] - start + offset, answer[1] - start + offset
                else:
                    stats["answer_outside_window"] += 1
            rows.append((ids, mask, segments, np.int32(first), np.int32(last), np.int32(index),
                         words, is_max))
    if stats["skipped"]:
        log.warning("skipped %d of %d training questions whose answer is not in the context",
                    stats["skipped"], len(examples))
    features = Features(stack(rows, FEATURE_NAMES), stats)
    stats["features"] = len(features)
    return features


def _context_tokens(context: str, encode: WordEncoder):
    spans = context_words(context)
    doc, tok_to_word, word_first_tok = [], [], []
    for w, pieces in enumerate(encode([context[s:e] for s, e in spans])):
        word_first_tok.append(len(doc))
        doc += pieces
        tok_to_word += [w] * len(pieces)
    return doc, tok_to_word, word_first_tok


def _answer_tokens(example: SquadExample, doc, word_first_tok, tokenizer):
    """(first, last) token of the answer in the whole context, or None."""
    if example.is_impossible or example.answer_start < 0:
        return None
    spans = context_words(example.context)
    char_start = example.answer_start
    char_end = char_start + len(example.answer_text)
    first_word = bisect.bisect_right([e for _, e in spans], char_start)
    last_word = bisect.bisect_left([s for s, _ in spans], char_end) - 1
    if first_word > last_word:
        return None
    first = word_first_tok[first_word]
    last = (word_first_tok[last_word + 1] - 1 if last_word + 1 < len(spans) else len(doc) - 1)
    # The answer may be part of a word ("1990" in "1990s"): use its own tokens when they
    # occur inside the word span, as the original's _improve_answer_span.
    answer = tokenizer.encode(example.answer_text)
    for s in range(first, last - len(answer) + 2):
        if answer and doc[s:s + len(answer)] == answer:
            return s, s + len(answer) - 1
    return first, last
