"""Fine-tuning metrics in plain numpy: classification, correlation, tagging (entity-level,
per tag, word segmentation), SQuAD.

Classification and correlation metrics are fractions in [0, 1] (or [-1, 1]); SQuAD exact
match and F1 are percentages, as the official evaluation scripts print them, so the numbers
compare directly with published ones.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

import numpy as np

from bertjax.tasks.tag_schemes import entities, word_spans


def accuracy(predictions, labels) -> float:
    predictions, labels = _pair(predictions, labels)
    return float(np.mean(predictions == labels))


def f1(predictions, labels, average: str = "binary", positive=1) -> float:
    """F1 of `positive` ("binary") or the unweighted mean over labels seen in either ("macro")."""
    predictions, labels = _pair(predictions, labels)
    if average == "binary":
        return _f1_of(predictions, labels, positive)
    if average == "macro":
        classes = np.union1d(predictions, labels)
        return float(np.mean([_f1_of(predictions, labels, c) for c in classes]))
    raise ValueError(f"average {average!r}: expected 'binary' or 'macro'")


def _f1_of(predictions, labels, positive) -> float:
    true_pos = np.sum((predictions == positive) & (labels == positive))
    denominator = np.sum(predictions == positive) + np.sum(labels == positive)
    return float(2 * true_pos / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation (CoLA's metric), multi-class form; 0 when undefined."""
    predictions, labels = _pair(predictions, labels)
    classes, index = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true_idx, pred_idx = index[: len(labels)], index[len(labels):]
    confusion = np.zeros((len(classes), len(classes)), np.float64)
    np.add.at(confusion, (true_idx, pred_idx), 1)
    true_k, pred_k = confusion.sum(1), confusion.sum(0)
    correct, total = np.trace(confusion), confusion.sum()
    denominator = np.sqrt((total**2 - pred_k @ pred_k) * (total**2 - true_k @ true_k))
    return float((correct * total - true_k @ pred_k) / denominator) if denominator else 0.0


def pearson(predictions, labels) -> float:
    x, y = _pair(np.asarray(predictions, np.float64), np.asarray(labels, np.float64))
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else 0.0


def spearman(predictions, labels) -> float:
    """Pearson correlation of the ranks, ties given their average rank."""
    return pearson(_ranks(np.asarray(predictions, np.float64)),
                   _ranks(np.asarray(labels, np.float64)))


def _ranks(x):
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.repeat((starts + ends - 1) / 2.0 + 1.0, ends - starts)
    return ranks


def _pair(predictions, labels):
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape or predictions.ndim != 1 or not len(labels):
        raise ValueError(f"predictions {predictions.shape} and labels {labels.shape}: expected "
                         f"two non-empty 1-D arrays of the same length")
    return predictions, labels


def entity_scores(true_tags: Sequence[Sequence[str]],
                  pred_tags: Sequence[Sequence[str]]) -> dict:
    """Entity-level micro precision / recall / F1 with seqeval's default-mode semantics
    (BIO or BIOES), plus the same per entity type under 'per_type'."""
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} gold sentences but {len(pred_tags)} predicted")
    gold, pred = set(), set()
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} gold tags but {len(p)} predicted")
        gold.update((kind, i, a, b) for kind, a, b in entities(t))
        pred.update((kind, i, a, b) for kind, a, b in entities(p))
    scores = _prf(len(gold & pred), len(pred), len(gold))
    scores["per_type"] = {
        kind: _prf(len({e for e in gold & pred if e[0] == kind}),
                   sum(e[0] == kind for e in pred), sum(e[0] == kind for e in gold))
        for kind in sorted({e[0] for e in gold | pred})}
    return scores


def tag_scores(true_tags: Sequence[Sequence[str]],
               pred_tags: Sequence[Sequence[str | None]]) -> dict:
    """Token accuracy, and per tag precision / recall / F1 with their unweighted mean
    ('macro_f1', over the tags in either). A word without a prediction (None) is wrong."""
    gold, pred = _flat_pairs(true_tags, pred_tags)
    per_tag = {tag: _prf(sum(g == p == tag for g, p in zip(gold, pred)),
                         sum(p == tag for p in pred), sum(g == tag for g in gold))
               for tag in sorted(set(gold) | {p for p in pred if p is not None})}
    return {"token_accuracy": sum(g == p for g, p in zip(gold, pred)) / max(len(gold), 1),
            "macro_f1": float(np.mean([s["f1"] for s in per_tag.values()])) if per_tag else 0.0,
            "per_tag": per_tag}


def word_scores(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                known_words: set[str] | None = None,
                texts: Sequence[Sequence[str]] | None = None) -> dict:
    """Word segmentation scores from character tags (BMES/BIES): word-level precision, recall
    and F1, a predicted word being right when it has exactly a gold word's span (the SIGHAN
    bakeoff scoring). With `known_words` (the training words) and the characters of each
    sentence (`texts`), also the recall of gold words outside them ('oov_recall')."""
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} gold sentences but {len(pred_tags)} predicted")
    correct = predicted = actual = oov = oov_found = 0
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} gold tags but {len(p)} predicted")
        gold, found = set(word_spans(t)), set(word_spans(p))
        correct, predicted, actual = correct + len(gold & found), predicted + len(found), \
            actual + len(gold)
        if known_words is not None and texts is not None:
            unknown = {s for s in gold if "".join(texts[i][s[0]:s[1]]) not in known_words}
            oov, oov_found = oov + len(unknown), oov_found + len(unknown & found)
    scores = _prf(correct, predicted, actual)
    if known_words is not None and texts is not None:
        scores["oov_recall"] = oov_found / oov if oov else 0.0
        scores["oov_words"] = oov
    return scores


def _flat_pairs(true_tags, pred_tags) -> tuple[list, list]:
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(true_tags)} gold sentences but {len(pred_tags)} predicted")
    gold, pred = [], []
    for i, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {i}: {len(t)} gold tags but {len(p)} predicted")
        gold += list(t)
        pred += list(p)
    return gold, pred


def _prf(correct: int, predicted: int, actual: int) -> dict:
    precision = correct / predicted if predicted else 0.0
    recall = correct / actual if actual else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f, "support": actual}


# --- SQuAD (the official v1.1 / v2.0 evaluation's definitions) --------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop ASCII punctuation, the articles a/an/the, and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)  # no-answer is right only against no-answer
    same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if not same:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_texts(answers: Sequence[str]) -> list[str]:
    # As the v2.0 script: answers that normalise to nothing count as no answer.
    texts = [a for a in answers if normalize_answer(a)]
    return texts or [""]


def _per_question(predictions: Mapping[str, str], gold: Mapping[str, Sequence[str]]):
    missing = [q for q in gold if q not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} of {len(gold)} questions have no prediction, "
                         f"e.g. {missing[:3]}")
    exact, f = {}, {}
    for qid, answers in gold.items():
        texts = _gold_texts(answers)
        exact[qid] = max(squad_exact(predictions[qid], t) for t in texts)
        f[qid] = max(squad_f1(predictions[qid], t) for t in texts)
    return exact, f


def squad_scores(predictions: Mapping[str, str], gold: Mapping[str, Sequence[str]],
                 best_span: Mapping[str, str] | None = None,
                 null_odds: Mapping[str, float] | None = None) -> dict:
    """Exact match and F1 (percent) over the questions in `gold` (qid -> answer texts, empty for
    an unanswerable v2.0 question; "" predicts no answer).

    With any unanswerable question, HasAns_/NoAns_ breakdowns are added. With `best_span`
    (the best non-null answer per question) and `null_odds` (null score minus best span score),
    also the best exact / F1 over no-answer thresholds and the thresholds that reach them.
    """
    exact, f = _per_question(predictions, gold)
    has_answer = {q: _gold_texts(a) != [""] for q, a in gold.items()}
    scores = {"exact": _percent(exact, gold), "f1": _percent(f, gold), "total": len(gold)}
    if not all(has_answer.values()):
        for name, subset in (("HasAns", [q for q in gold if has_answer[q]]),
                             ("NoAns", [q for q in gold if not has_answer[q]])):
            if subset:
                scores[f"{name}_exact"] = _percent(exact, subset)
                scores[f"{name}_f1"] = _percent(f, subset)
                scores[f"{name}_total"] = len(subset)
    if null_odds is not None:
        if best_span is None:
            raise ValueError("null_odds needs best_span: the answer to give when not null")
        span_exact, span_f = _per_question(best_span, gold)
        for name, answered in (("exact", span_exact), ("f1", span_f)):
            best, threshold = best_null_threshold(answered, has_answer, null_odds)
            scores[f"best_{name}"], scores[f"best_{name}_thresh"] = best, threshold
    return scores


def best_null_threshold(answered: Mapping[str, float], has_answer: Mapping[str, bool],
                        null_odds: Mapping[str, float]) -> tuple[float, float]:
    """The threshold t maximising the score when a question is answered iff null_odds <= t.

    `answered` is each question's score (0..1) when its best span is given; a null answer
    scores 1 on an unanswerable question and 0 otherwise. Returns (best percent, t).
    """
    qids = sorted(answered, key=lambda q: null_odds[q])
    odds = np.array([null_odds[q] for q in qids], np.float64)
    null_score = np.array([0.0 if has_answer[q] else 1.0 for q in qids])
    gain = np.cumsum(np.array([answered[q] for q in qids]) - null_score)
    last_of_tie = np.r_[odds[1:] != odds[:-1], True]
    totals = np.r_[0.0, gain[last_of_tie]] + null_score.sum()
    thresholds = np.r_[odds[0] - 1.0, odds[last_of_tie]]  # first: answer nothing
    best = int(np.argmax(totals))
    return 100.0 * totals[best] / len(qids), float(thresholds[best])


def _percent(per_question: Mapping[str, float], qids) -> float:
    return 100.0 * float(np.mean([per_question[q] for q in qids]))
