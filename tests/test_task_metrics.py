"""Task metrics against hand-checked cases and against the libraries they re-implement
(scikit-learn, scipy, seqeval's default mode), which bertjax itself does not depend on."""
import numpy as np
import pytest
import scipy.stats
import seqeval.metrics
import sklearn.metrics

from bertjax.tasks import tag_schemes as tagging
from bertjax.tasks import metrics as tm


def test_classification_metrics_hand_checked():
    labels = [1, 1, 1, 0, 0, 0, 0, 2]
    preds = [1, 0, 1, 0, 1, 0, 0, 2]
    assert tm.accuracy(preds, labels) == pytest.approx(6 / 8)
    # positive class 1: tp 2, predicted 3, actual 3 -> F1 2/3
    assert tm.f1(preds, labels) == pytest.approx(2 / 3)
    # class 0: tp 3, predicted 4, actual 4 -> 3/4; class 2 -> 1
    assert tm.f1(preds, labels, average="macro") == pytest.approx((2 / 3 + 3 / 4 + 1) / 3)
    # Binary MCC from the confusion counts tp=2 tn=3 fp=1 fn=1.
    binary_l, binary_p = labels[:7], preds[:7]
    expected = (2 * 3 - 1 * 1) / np.sqrt(3 * 3 * 4 * 4)
    assert tm.matthews_corrcoef(binary_p, binary_l) == pytest.approx(expected)
    assert tm.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # undefined -> 0, as sklearn
    assert tm.matthews_corrcoef([0, 1, 2, 0], [0, 1, 2, 0]) == pytest.approx(1.0)


def test_classification_metrics_agree_with_scikit_learn():
    rng = np.random.default_rng(0)
    for classes, n in ((2, 300), (3, 200), (5, 50)):
        labels = rng.integers(0, classes, n)
        preds = np.where(rng.random(n) < 0.6, labels, rng.integers(0, classes, n))
        assert tm.accuracy(preds, labels) == pytest.approx(
            sklearn.metrics.accuracy_score(labels, preds), abs=1e-12)
        assert tm.f1(preds, labels, "macro") == pytest.approx(
            sklearn.metrics.f1_score(labels, preds, average="macro"), abs=1e-12)
        assert tm.matthews_corrcoef(preds, labels) == pytest.approx(
            sklearn.metrics.matthews_corrcoef(labels, preds), abs=1e-12)
        if classes == 2:
            assert tm.f1(preds, labels) == pytest.approx(
                sklearn.metrics.f1_score(labels, preds), abs=1e-12)


def _random_tags(rng, length: int, prefixes: str) -> list[str]:
    """Tag sequences that break their scheme now and then, as model predictions do."""
    out = []
    for _ in range(length):
        prefix = rng.choice(list(prefixes) + ["O"] * 2)
        out.append("O" if prefix == "O" else f"{prefix}-{rng.choice(['PER', 'LOC', 'ORG'])}")
    return out


@pytest.mark.parametrize("prefixes", ["BI", "BIES"])
def test_entity_scores_agree_with_seqeval_default_mode(prefixes):
    rng = np.random.default_rng(len(prefixes))
    gold = [_random_tags(rng, int(rng.integers(1, 15)), prefixes) for _ in range(300)]
    pred = [[t if rng.random() < 0.7 else _random_tags(rng, 1, prefixes)[0] for t in s]
            for s in gold]
    ours = tm.entity_scores(gold, pred)
    for name in ("precision", "recall", "f1"):
        theirs = getattr(seqeval.metrics, f"{name}_score")(gold, pred)
        assert ours[name] == pytest.approx(theirs, abs=1e-12), name
    report = seqeval.metrics.classification_report(gold, pred, output_dict=True)
    for kind, scores in ours["per_type"].items():
        assert scores["f1"] == pytest.approx(report[kind]["f1-score"], abs=1e-12), kind
        assert scores["support"] == report[kind]["support"], kind


def test_metrics_reject_mismatched_inputs():
    with pytest.raises(ValueError, match="same length"):
        tm.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="'binary' or 'macro'"):
        tm.f1([1], [1], average="micro")


def test_correlations_match_scipy_including_ties():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = 0.6 * x + rng.normal(size=200)
    assert tm.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-12)
    tied_x, tied_y = np.round(x), np.round(y * 2) / 2  # many ties
    assert tm.spearman(tied_x, tied_y) == pytest.approx(
        scipy.stats.spearmanr(tied_x, tied_y)[0], abs=1e-12)
    assert tm.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)


def test_entity_decoding_is_lenient_like_conlleval():
    tags = ["B-LOC", "I-PER", "I-PER", "E-PER", "E-PER", "O", "I-X", "S-X", "E-X"]
    assert tagging.entities(tags) == [("LOC", 0, 0), ("PER", 1, 3), ("PER", 4, 4),
                                      ("X", 6, 6), ("X", 7, 7), ("X", 8, 8)]
    assert tagging.canonical(["O", "I-PER", "I-PER", "B-LOC"], "BIO") == [
        "O", "B-PER", "I-PER", "B-LOC"]
    assert tagging.canonical(["B-PER", "O", "B-LOC", "I-LOC"], "BIOES") == [
        "S-PER", "O", "B-LOC", "E-LOC"]
    with pytest.raises(ValueError, match="'PERSON'"):
        tagging.entities(["PERSON"])


def test_entity_scores_bio_and_bioes():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["O", "B-ORG", "I-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "I-LOC", "O"], ["O", "B-ORG", "I-ORG", "O", "B-ORG"]]
    scores = tm.entity_scores(gold, pred)  # PER and LOC right, ORG cut short, extra ORG
    assert scores["precision"] == pytest.approx(2 / 4)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert scores["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert scores["per_type"]["PER"]["f1"] == 1.0

    bioes = tm.entity_scores([["B-PER", "E-PER", "S-LOC", "O"]],
                             [["B-PER", "I-PER", "S-LOC", "S-LOC"]])
    assert (bioes["precision"], bioes["recall"]) == (pytest.approx(2 / 3), 1.0)
    assert tm.entity_scores([["O", "O"]], [["O", "O"]])["f1"] == 0.0
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        tm.entity_scores([["O", "O"]], [["O"]])


def test_squad_normalisation_and_scores():
    assert tm.normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert tm.normalize_answer("an apple and a pear") == "apple and pear"
    assert tm.squad_exact("the Denver Broncos", "Denver Broncos") == 1.0
    # pred tokens {denver, broncos, team}, gold {denver, broncos}: P 2/3 R 1
    assert tm.squad_f1("Denver Broncos team", "The Denver Broncos") == pytest.approx(0.8)
    scores = tm.squad_scores({"q1": "Denver Broncos", "q2": "in 1990"},
                             {"q1": ["Denver Broncos", "Broncos"], "q2": ["1990", "the 1990s"]})
    # q1 exact; q2 best F1 against "1990" is 2*(1/2)*1/(1/2+1) = 2/3
    assert scores["exact"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert "HasAns_exact" not in scores
    with pytest.raises(ValueError, match="1 of 2 questions have no prediction"):
        tm.squad_scores({"q1": "x"}, {"q1": ["x"], "q2": ["y"]})


def test_squad_v2_no_answer_and_best_threshold():
    gold = {"a": ["Paris"], "b": [], "c": ["blue"], "d": []}
    predictions = {"a": "Paris", "b": "", "c": "", "d": "red"}
    scores = tm.squad_scores(predictions, gold)
    assert scores["exact"] == 50.0 and scores["HasAns_exact"] == 50.0
    assert scores["NoAns_exact"] == 50.0 and scores["NoAns_total"] == 2

    best_span = {"a": "Paris", "b": "Lyon", "c": "blue", "d": "red"}
    null_odds = {"a": -3.0, "b": 2.0, "c": -1.0, "d": 0.5}
    scores = tm.squad_scores(predictions, gold, best_span=best_span, null_odds=null_odds)
    # Answer a and c (odds <= -1), leave b and d null: all four right.
    assert scores["best_exact"] == 100.0 and scores["best_exact_thresh"] == -1.0
    assert scores["best_f1"] == 100.0


def test_tag_scores_agree_with_scikit_learn():
    gold = [["NN", "VB", "DT", "NN"], ["PRP", "VB", "NN"]]
    pred = [["NN", "NN", "DT", "NN"], ["PRP", "VB", "JJ"]]
    scores = tm.tag_scores(gold, pred)
    flat_gold, flat_pred = sum(gold, []), sum(pred, [])
    assert scores["token_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(flat_gold, flat_pred))
    tags = sorted(set(flat_gold) | set(flat_pred))
    p, r, f, support = sklearn.metrics.precision_recall_fscore_support(
        flat_gold, flat_pred, labels=tags, zero_division=0)
    for i, tag in enumerate(tags):
        assert scores["per_tag"][tag]["precision"] == pytest.approx(p[i])
        assert scores["per_tag"][tag]["recall"] == pytest.approx(r[i])
        assert scores["per_tag"][tag]["f1"] == pytest.approx(f[i])
        assert scores["per_tag"][tag]["support"] == support[i]
    assert scores["macro_f1"] == pytest.approx(f.mean())
    # A word without a prediction is an error, not a skipped word.
    assert tm.tag_scores([["NN", "VB"]], [["NN", None]])["token_accuracy"] == 0.5
