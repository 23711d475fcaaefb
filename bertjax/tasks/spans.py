"""Answer text from QA start/end scores: the n-best span search of the original run_squad.

Per example, over all its windows: the `n_best` highest start and end scores are paired;
a pair counts when both tokens lie in the context, start <= end, the span is at most
`max_answer_length` tokens and the start token has its maximum context in that window. The
span maps back through the context words to the original characters. With SQuAD v2.0 the
null answer (both scores at [CLS]; the lowest over the windows) competes: the question is
left unanswered when null score - best span score > `null_threshold`.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from bertjax.tasks.features import Features
from bertjax.tasks.squad_inputs import SquadExample, context_words


def best_answers(examples: Sequence[SquadExample], features: Features, start_logits_NL,
                 end_logits_NL, n_best: int = 20, max_answer_length: int = 30,
                 version_2: bool = False, null_threshold: float = 0.0) -> dict:
    """{'predictions': qid -> text ("" = no answer), 'best_span': qid -> best non-null text,
    'nbest': qid -> [{text, probability, start_logit, end_logit}], and for v2.0
    'null_odds': qid -> null score minus best span score}."""
    start_logits_NL, end_logits_NL = np.asarray(start_logits_NL), np.asarray(end_logits_NL)
    if start_logits_NL.shape != features.arrays["input_ids"].shape:
        raise ValueError(f"start logits {start_logits_NL.shape} do not match the features "
                         f"{features.arrays['input_ids'].shape}")
    rows_of = collections.defaultdict(list)
    for row, index in enumerate(features.arrays["example_index"]):
        rows_of[int(index)].append(row)
    out = {"predictions": {}, "best_span": {}, "nbest": {}}
    if version_2:
        out["null_odds"] = {}
    for index, example in enumerate(examples):
        rows = rows_of.get(index)
        if not rows:
            continue  # skipped when featurised (training data only)
        candidates, null = [], None
        for row in rows:
            starts, ends = start_logits_NL[row], end_logits_NL[row]
            if null is None or starts[0] + ends[0] < null["start_logit"] + null["end_logit"]:
                null = {"text": "", "start_logit": float(starts[0]), "end_logit": float(ends[0])}
            candidates += _row_candidates(features, row, starts, ends, n_best, max_answer_length)
        nbest = _nbest(example, candidates, n_best)
        best_span = nbest[0] if nbest else {"text": "", "start_logit": 0.0, "end_logit": 0.0}
        text = best_span["text"]
        if version_2:
            span_score = best_span["start_logit"] + best_span["end_logit"] if nbest else -np.inf
            odds = null["start_logit"] + null["end_logit"] - span_score
            out["null_odds"][example.qid] = float(odds)
            if odds > null_threshold:
                text = ""
            nbest = sorted(nbest + [null], key=lambda c: -(c["start_logit"] + c["end_logit"]))
        _add_probabilities(nbest)
        out["predictions"][example.qid] = text
        out["best_span"][example.qid] = best_span["text"]
        out["nbest"][example.qid] = nbest
    return out


def _row_candidates(features: Features, row: int, starts, ends, n_best: int,
                    max_answer_length: int) -> list:
    words = features.arrays["token_to_word"][row]
    is_max = features.arrays["token_is_max_context"][row]
    top_s = np.argsort(-starts, kind="stable")[:n_best]
    top_e = np.argsort(-ends, kind="stable")[:n_best]
    s, e = np.meshgrid(top_s, top_e, indexing="ij")
    ok = ((words[s] >= 0) & (words[e] >= 0) & (e >= s) & (e - s + 1 <= max_answer_length)
          & is_max[s])
    return [(float(starts[a] + ends[b]), float(starts[a]), float(ends[b]), int(words[a]),
             int(words[b])) for a, b in zip(s[ok], e[ok])]


def _nbest(example: SquadExample, candidates, n_best: int) -> list[dict]:
    spans = context_words(example.context)
    nbest, seen = [], set()
    for _, start_logit, end_logit, first, last in sorted(candidates, key=lambda c: -c[0]):
        text = example.context[spans[first][0]:spans[last][1]]
        if text in seen:
            continue
        seen.add(text)
        nbest.append({"text": text, "start_logit": start_logit, "end_logit": end_logit})
        if len(nbest) == n_best:
            break
    return nbest


def _add_probabilities(nbest: list[dict]) -> None:
    if not nbest:
        return
    scores = np.array([c["start_logit"] + c["end_logit"] for c in nbest])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    for c, p in zip(nbest, probs):
        c["probability"] = float(p)
