"""SQuAD inputs and answers: reading v1.1/v2.0 (unfound answers counted and skipped), word
spans, sliding windows, and the n-best search mapping scores back to the original text."""
import json
import logging

import numpy as np
import pytest

from bertjax.tasks.spans import best_answers
from bertjax.tasks.squad_inputs import SquadExample, context_words, read_squad, squad_features
from bertjax.tasks.metrics import squad_scores
from benchmarks.task_data import austen_paragraphs, wordpiece


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece()


def _squad_file(path, qas, context, version=None):
    root = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    if version:
        root["version"] = version
    path.write_text(json.dumps(root), encoding="utf-8")
    return str(path)


CONTEXT = "The Broncos beat the Panthers 24–10 in Santa Clara, California, in the 1990s."


def test_read_v1_locates_relocates_and_counts_missing_answers(tmp_path, caplog, tokenizer):
    qas = [
        {"id": "ok", "question": "Who won?", "answers": [{"text": " Broncos", "answer_start": 3}]},
        {"id": "moved", "question": "Where?", "answers": [{"text": "Santa Clara",
                                                          "answer_start": 30}]},
        {"id": "lost", "question": "Score?", "answers": [{"text": "31-7", "answer_start": 2}]},
    ]
    with caplog.at_level(logging.WARNING):
        examples = read_squad(_squad_file(tmp_path / "train.json", qas, CONTEXT))
    assert [e.answer_start for e in examples] == [4, CONTEXT.index("Santa"), -1]
    assert examples[0].answer_text == "Broncos"
    assert "1 answers were not at their answer_start" in caplog.text
    assert "1 of 3 answers are not in their context" in caplog.text
    features = squad_features(examples, tokenizer, 64, 32, 16, training=True)
    assert features.stats["skipped"] == 1
    assert sorted(set(features.arrays["example_index"])) == [0, 1]
    evaluation = squad_features(examples, tokenizer, 64, 32, 16)
    assert sorted(set(evaluation.arrays["example_index"])) == [0, 1, 2]


def test_read_v2_impossible_and_malformed_files(tmp_path, tokenizer):
    qas = [{"id": "no", "question": "Who lost?", "answers": [], "is_impossible": True,
            "plausible_answers": [{"text": "Panthers", "answer_start": 21}]}]
    examples = read_squad(_squad_file(tmp_path / "v2.json", qas, CONTEXT, "v2.0"))
    assert examples[0].is_impossible and examples[0].answers == []
    features = squad_features(examples, tokenizer, 64, 32, 16, training=True)
    assert features.arrays["start_positions"].tolist() == [0]
    assert features.arrays["end_positions"].tolist() == [0]

    (tmp_path / "bad.json").write_text('{"version": "1.1"}')
    with pytest.raises(ValueError, match=r"bad.json: expected SQuAD JSON"):
        read_squad(str(tmp_path / "bad.json"))
    broken = _squad_file(tmp_path / "broken.json", [{"id": "x", "answers": []}], CONTEXT)
    with pytest.raises(ValueError, match=r"broken.json: question 0: malformed SQuAD entry "
                                         r"\(missing or wrong 'question'\)"):
        read_squad(broken)


def test_context_words_follow_bert_basic_splits():
    text = "Café (1990s) 東京 e-mail\u00a0x"
    spans = context_words(text)
    assert [text[s:e] for s, e in spans] == ["Café", "(", "1990s", ")", "東", "京", "e", "-",
                                             "mail", "x"]


def _austen_examples():
    paragraphs = austen_paragraphs()
    first = next(i for i, p in enumerate(paragraphs) if p.startswith("It is a truth universally"))
    context = ""
    for paragraph in paragraphs[first:]:
        context = f"{context} {paragraph}".strip()
        if len(context) > 6000:
            break
    words = context_words(context)
    examples = []
    for k, w in enumerate(range(5, len(words) - 5, 97)):
        s, e = words[w][0], words[w + 2][1]
        examples.append(SquadExample(f"q{k}", f"What comes after word {w}?", context,
                                     [context[s:e]], s, context[s:e]))
    return examples


def test_windows_cover_every_token_once_and_answers_round_trip(tokenizer):
    examples = _austen_examples()
    features = squad_features(examples, tokenizer, max_seq_length=96, doc_stride=32,
                              max_query_length=16, training=True)
    a = features.arrays
    windows = (a["example_index"] == 0).sum()
    assert windows > 20  # a 6000-character context over 96-token rows
    # Every context token has its maximum context in exactly one window: read in window
    # order, those tokens are the whole context.
    context = examples[0].context
    pieces = [tokenizer.encode(context[s:e]) for s, e in context_words(context)]
    token_words = [w for w, p in enumerate(pieces) for _ in p]
    for i in range(3):
        rows = a["example_index"] == i
        words = a["token_to_word"][rows][a["token_is_max_context"][rows]]
        assert words.tolist() == token_words
        assert (a["segment_ids"][rows][a["token_to_word"][rows] >= 0] == 1).all()
    # Every answer is inside some window; each window outside it points at [CLS].
    for i, example in enumerate(examples):
        rows = np.flatnonzero(a["example_index"] == i)
        inside = [r for r in rows if a["start_positions"][r] > 0]
        assert inside, example.qid
        for r in inside:
            s, e = a["start_positions"][r], a["end_positions"][r]
            assert a["input_ids"][r][s:e + 1].tolist() == tokenizer.encode(example.answer_text)
    # One-hot scores at the gold positions give back exactly the gold text.
    start_logits = np.where(np.arange(96)[None] == a["start_positions"][:, None], 10.0, 0.0)
    end_logits = np.where(np.arange(96)[None] == a["end_positions"][:, None], 10.0, 0.0)
    start_logits[a["start_positions"] == 0, 0] = -10.0
    out = best_answers(examples, features, start_logits, end_logits)
    assert out["predictions"] == {e.qid: e.answer_text for e in examples}
    gold = {e.qid: e.answers for e in examples}
    assert squad_scores(out["predictions"], gold)["exact"] == 100.0


def test_answer_inside_a_word_uses_its_own_tokens(tokenizer):
    context = "She played three xylophones at once."
    example = SquadExample("q", "What?", context, ["xylophone"], context.index("xylo"),
                           "xylophone")
    a = squad_features([example], tokenizer, 32, 16, 8, training=True).arrays
    s, e = a["start_positions"][0], a["end_positions"][0]
    tokens = [tokenizer.id_to_token(int(i)) for i in a["input_ids"][0][s:e + 2]]
    assert tokens == ["x", "##yl", "##ophone", "##s"]  # the answer stops before "##s"


def _one_window(tokenizer, context, question="Who?"):
    example = SquadExample("q", question, context, [])
    features = squad_features([example], tokenizer, 64, 32, 16)
    return example, features


def _logits(features, start_at, end_at, null=0.0):
    start, end = np.full((1, 64), -5.0), np.full((1, 64), -5.0)
    start[0, 0] = end[0, 0] = null / 2
    for pos, score in start_at.items():
        start[0, pos] = score
    for pos, score in end_at.items():
        end[0, pos] = score
    return start, end


def test_nbest_rules_and_original_text(tokenizer):
    example, features = _one_window(tokenizer, "Café Müller opened in Zürich in 1928.")
    words = features.arrays["token_to_word"][0]
    spans = context_words(example.context)
    pos = {example.context[spans[w][0]:spans[w][1]]: int(np.flatnonzero(words == w)[0])
           for w in set(words[words >= 0].tolist())}
    # The two best pairs end before they start and are rejected; the next is "Café Müller".
    start, end = _logits(features, {pos["Zürich"]: 9.0, pos["Café"]: 8.0},
                         {pos["Café"]: 7.0, pos["Müller"]: 8.5})
    out = best_answers([example], features, start, end)
    assert out["predictions"]["q"] == "Café Müller"
    probs = [c["probability"] for c in out["nbest"]["q"]]
    assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1.0)
    # A span longer than max_answer_length tokens loses to a shorter, lower-scored one.
    start, end = _logits(features, {pos["Café"]: 9.0}, {pos["1928"]: 9.0, pos["Müller"]: 1.0})
    assert best_answers([example], features, start, end)["predictions"]["q"] == (
        "Café Müller opened in Zürich in 1928")
    short = best_answers([example], features, start, end, max_answer_length=4)
    assert short["predictions"]["q"] == "Café Müller"


def test_v2_null_answer_against_threshold(tokenizer):
    example, features = _one_window(tokenizer, "Paris is the capital of France.")
    words = features.arrays["token_to_word"][0]
    paris = int(np.flatnonzero(words == 0)[0])
    start, end = _logits(features, {paris: 3.0}, {paris: 3.0}, null=7.0)
    out = best_answers([example], features, start, end, version_2=True)
    assert out["predictions"]["q"] == "" and out["best_span"]["q"] == "Paris"
    assert out["null_odds"]["q"] == pytest.approx(1.0)
    assert out["nbest"]["q"][0]["text"] == ""
    lenient = best_answers([example], features, start, end, version_2=True, null_threshold=1.5)
    assert lenient["predictions"]["q"] == "Paris"
    assert best_answers([example], features, start, end)["predictions"]["q"] == "Paris"
