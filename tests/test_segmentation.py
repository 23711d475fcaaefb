"""Chinese word segmentation inputs and scores: segmented text read as characters with BMES
tags, bad lines counted or rejected with file:line, CoNLL character files detected, and the
word-level metric (with OOV recall) on hand-checked cases."""
import itertools
import logging

import numpy as np
import pytest

from bertjax.tasks import metrics
from bertjax.tasks import tag_schemes
from bertjax.tasks.segmentation import looks_like_conll, read_segmented
from bertjax.tasks.tagging import segmented_words


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_segmented_text_becomes_characters_with_bmes_tags(tmp_path, caplog):
    path = _write(tmp_path / "train.txt", "北京 欢迎 你\n\n我们 喜欢 上海 的 秋天\n")
    with caplog.at_level(logging.INFO):
        sentences = read_segmented(path)
    assert sentences[0].words == list("北京欢迎你")
    assert sentences[0].tags == ["B", "E", "B", "E", "S"]
    assert sentences[1].guid == "train.txt:3"
    assert segmented_words(sentences[1].words, sentences[1].tags) == ["我们", "喜欢", "上海",
                                                                       "的", "秋天"]
    assert "1 blank lines hold no sentence" in caplog.text


def test_lines_without_spaces_are_counted_or_the_file_rejected(tmp_path, caplog):
    path = _write(tmp_path / "few.txt", "北京 欢迎 你\n谢谢\n我们 喜欢 上海\n")
    with caplog.at_level(logging.WARNING):
        sentences = read_segmented(path)
    assert len(sentences) == 3 and sentences[1].tags == ["B", "E"]  # one word, as written
    assert "1 lines have no space; each is read as a single word (first: few.txt:2)" in \
        caplog.text
    raw = _write(tmp_path / "raw.txt", "北京欢迎你\n我们喜欢上海的秋天\n你 好\n")
    with pytest.raises(ValueError, match=r"raw.txt: 2 of 3 lines have no space between words "
                                         r"\(first: raw.txt:1\): expected segmented text"):
        read_segmented(raw)


def test_files_to_segment_keep_one_record_per_line(tmp_path):
    path = _write(tmp_path / "input.txt", "北京欢迎你\n\n我 们\n")
    sentences = read_segmented(path, labelled=False)
    assert [s.words for s in sentences] == [list("北京欢迎你"), [], ["我", "们"]]
    assert all(s.tags is None for s in sentences)


def test_conll_character_files_are_told_from_segmented_text(tmp_path):
    assert looks_like_conll(_write(tmp_path / "a.conll", "北 B\n京 E\n\n你 S\n"))
    assert not looks_like_conll(_write(tmp_path / "b.txt", "北京 欢迎 你\n"))


def test_word_scores_count_exact_spans_and_unknown_words():
    gold = [tag_schemes.segmentation_tags([2, 2, 1])]  # 北京 欢迎 你
    pred = [tag_schemes.segmentation_tags([2, 1, 1, 1])]  # 北京 欢 迎 你
    scores = metrics.word_scores(gold, pred, {"北京", "你"}, [list("北京欢迎你")])
    assert scores["precision"] == pytest.approx(2 / 4) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert scores["oov_words"] == 1 and scores["oov_recall"] == 0.0  # 欢迎 was missed
    # The decoder is lenient, as the metric must be for any predicted sequence.
    assert tag_schemes.word_spans(["M", "M", "S", "E", "B"]) == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_decoding_finds_the_most_probable_well_formed_segmentation():
    """Viterbi over B/M/E/S agrees with trying every tag sequence that spells whole words, and
    never returns what a per-character argmax can (B B, M S, ending on B)."""
    from bertjax.tasks.tag_schemes import best_segmentation, segmentation_tags, word_spans

    labels = ["B", "E", "M", "S"]
    rng = np.random.default_rng(0)

    def well_formed(tags):
        return tags == segmentation_tags(b - a for a, b in word_spans(tags))

    for n in range(1, 6):
        for _ in range(20):
            log_probs = np.log(rng.dirichlet(np.ones(4), size=n)).astype(np.float32)
            best = max((t for t in itertools.product(labels, repeat=n) if well_formed(list(t))),
                       key=lambda t: sum(log_probs[i, labels.index(x)] for i, x in enumerate(t)))
            assert best_segmentation(log_probs, labels) == list(best)
    argmax_says_b_b = np.log(np.array([[.6, .1, .1, .2], [.5, .4, .05, .05]], np.float32))
    assert best_segmentation(argmax_says_b_b, labels) == ["B", "E"]
