"""CoNLL tagging inputs: both file layouts, scheme repair (counted) or strict errors with
file:line, first-sub-token labels, and long sentences split and mapped back word for word."""
import logging

import numpy as np
import pytest

from bertjax.tasks.tagging import (TaggedSentence, read_conll, tag_vocab, tagging_features,
                                word_predictions)
from task_data import wordpiece


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece()


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_wnut_tab_layout_with_lone_tab_separators(tmp_path):
    path = _write(tmp_path / "ner.txt", "@paulwalk\tO\nEmpire\tB-facility\nState\tI-facility\n"
                                        "\t\nPretty\tO\nbad\tO\n\t\n")
    sentences = read_conll(path)
    assert [s.words for s in sentences] == [["@paulwalk", "Empire", "State"], ["Pretty", "bad"]]
    assert sentences[0].tags == ["O", "B-facility", "I-facility"]
    assert sentences[1].guid == "ner.txt:5"


def test_conll2003_space_layout_skips_docstart(tmp_path):
    path = _write(tmp_path / "train.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n"
                                          "rejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n"
                                          "-DOCSTART- -X- -X- O\nPeter NNP B-NP B-PER\n")
    sentences = read_conll(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter"]]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC"]


def test_scheme_violations_are_repaired_and_counted_or_strict_errors(tmp_path, caplog):
    path = _write(tmp_path / "iob1.txt", "Peter\tI-PER\nBlack\tI-PER\nin\tO\nParis\tI-LOC\n\n"
                                         "New\tB-LOC\nYork\tI-ORG\n")
    with caplog.at_level(logging.WARNING):
        sentences = read_conll(path)
    assert sentences[0].tags == ["B-PER", "I-PER", "O", "B-LOC"]
    assert sentences[1].tags == ["B-LOC", "B-ORG"]
    assert "repaired 3 tags that break the BIO scheme" in caplog.text
    assert "iob1.txt:1: tag 'I-PER' cannot follow 'the sentence start'" in caplog.text
    with pytest.raises(ValueError, match=r"iob1.txt:1: tag 'I-PER' cannot follow 'the sentence "
                                         r"start' in BIO"):
        read_conll(path, strict=True)


def test_bioes_detected_and_checked(tmp_path):
    path = _write(tmp_path / "bioes.txt", "New\tB-LOC\nYork\tE-LOC\nis\tO\nbig\tS-X\n\n"
                                          "Ann\tB-PER\n")
    sentences = read_conll(path)
    assert sentences[0].tags == ["B-LOC", "E-LOC", "O", "S-X"]
    assert sentences[1].tags == ["S-PER"]  # a lone B- is a single-token entity in BIOES
    with pytest.raises(ValueError, match="holds E-/S- tags but the scheme is BIO"):
        read_conll(path, scheme="BIO")
    with pytest.raises(ValueError, match=r"bioes.txt:6: tag 'B-PER' cannot follow 'the sentence "
                                         r"start' in BIOES"):
        read_conll(path, strict=True)


def test_malformed_lines_name_file_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"one.txt:2: expected a token and a tag"):
        read_conll(_write(tmp_path / "one.txt", "a\tO\nlonely\n"))
    with pytest.raises(ValueError, match=r"tag.txt:1: tag 'PERSON': expected 'O' or one of"):
        read_conll(_write(tmp_path / "tag.txt", "Ann\tPERSON\n"))
    assert read_conll(_write(tmp_path / "raw.txt", "just\nwords\n"), labelled=False)[0].tags is None


def test_labels_only_at_first_sub_token(tokenizer):
    sentences = [TaggedSentence("s", ["Johanson", "visited", "Tegucigalpa"], ["B-PER", "O", "B-LOC"])]
    vocab = tag_vocab(sentences)
    assert vocab.labels == ["O", "B-LOC", "B-PER"]
    features = tagging_features(sentences, tokenizer, 16, vocab)
    ids, labels = features.arrays["input_ids"][0], features.arrays["label_ids"][0]
    pieces = [tokenizer.encode(w) for w in sentences[0].words]
    assert len(pieces[0]) > 1 and len(pieces[2]) > 1  # real sub-word splits
    expected = [-1]
    for piece, tag in zip(pieces, sentences[0].tags):
        expected += [vocab.id(tag, "")] + [-1] * (len(piece) - 1)
    n = len(expected)
    np.testing.assert_array_equal(labels[:n], expected)
    assert (labels[n:] == -1).all()
    np.testing.assert_array_equal(ids[:n + 1], [tokenizer.cls_id] + sum(pieces, [])
                                  + [tokenizer.sep_id])
    with pytest.raises(ValueError, match=r"dev:3: label 'I-MISC' does not occur"):
        tagging_features([TaggedSentence("dev:3", ["x"], ["I-MISC"])], tokenizer, 16, vocab)


def test_long_sentences_split_at_words_and_map_back(tokenizer):
    words = [f"word{i}" for i in range(40)] + ["\u200b"]  # a word of nothing becomes [UNK]
    tags = ["B-X" if i % 3 == 0 else "O" for i in range(len(words))]
    sentences = [TaggedSentence("a", words, tags), TaggedSentence("b", ["short"], ["O"])]
    vocab = tag_vocab(sentences)
    features = tagging_features(sentences, tokenizer, 12, vocab)
    assert features.stats["split"] == 1 and len(features) > 4
    assert (features.arrays["input_mask"].sum(1) <= 12).all()
    # Feeding the gold ids back as "predictions" must give every word its own tag.
    recovered = word_predictions(features, np.maximum(features.arrays["label_ids"], 0), sentences)
    assert [vocab.labels[i] for i in recovered[0]] == tags
    assert [vocab.labels[i] for i in recovered[1]] == ["O"]
