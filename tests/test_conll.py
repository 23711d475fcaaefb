"""CoNLL tagging inputs: both file layouts, the kind of tags (entity, plain, segmentation)
detected or given, scheme repair (counted) or strict errors with file:line, labels on the
first piece that carries the word (WordPiece and SentencePiece, Chinese characters too), and
long sentences read in overlapping windows with every word scored once."""
import logging

import numpy as np
import pytest

from bertjax.data import tokenizers
from bertjax.tasks.tagging import (TaggedSentence, read_conll, tag_vocab, tagging_features,
                                word_predictions)
from benchmarks.task_data import wordpiece


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
        read_conll(_write(tmp_path / "tag.txt", "Ann\tPERSON\n"), kind="entity")
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


def test_part_of_speech_tags_are_plain_classes_and_mixed_files_are_errors(tmp_path, caplog):
    path = _write(tmp_path / "pos.conll", "Emma\tNNP\nwalks\tVBZ\n\nShe\tPRP\nIs\tVBZ\n")
    sentences = read_conll(path)  # detected: not an entity scheme, nothing repaired
    assert [s.tags for s in sentences] == [["NNP", "VBZ"], ["PRP", "VBZ"]]
    mixed = _write(tmp_path / "mixed.conll", "Emma\tB-PER\nwalks\tO\n\nShe\tPRP\n")
    with pytest.raises(ValueError, match=r"mixed.conll:4: tag 'PRP' is not an entity tag, but "
                                         r"line 1 holds the entity tag 'B-PER'"):
        read_conll(mixed)
    # Told that the tags are classes, every tag is one, as written.
    assert [s.tags for s in read_conll(mixed, kind="plain")] == [["B-PER", "O"], ["PRP"]]


def test_segmentation_tags_detected_and_repaired(tmp_path, caplog):
    path = _write(tmp_path / "cws.conll", "北 B\n京 E\n欢 B\n迎 E\n你 S\n\n我 M\n们 E\n")
    with caplog.at_level(logging.WARNING):
        sentences = read_conll(path)
    assert sentences[0].tags == ["B", "E", "B", "E", "S"]
    assert sentences[1].tags == ["B", "E"]  # an M cannot start a word: read as the metric does
    assert "repaired 1 tags that break the BMES scheme" in caplog.text
    with pytest.raises(ValueError, match=r"cws.conll:7: tag 'M' cannot follow 'the sentence "
                                         r"start' in BMES"):
        read_conll(path, strict=True)
    with pytest.raises(ValueError, match=r"bad.conll: segmentation tags 'X'"):
        read_conll(_write(tmp_path / "bad.conll", "北 B\n京 X\n"), kind="segmentation")


def _labelled_pieces(features, row=0):
    at = features.arrays["label_ids"][row] >= 0
    return features.arrays["input_ids"][row][at]


@pytest.fixture(scope="module")
def chinese_sentencepiece(tmp_path_factory):
    """A SentencePiece model trained on Chinese, as `prepare` trains one: its pieces span
    several characters ('北京', '中国')."""
    text = ["北京是中国的首都。", "我喜欢北京的秋天。", "中国人喜欢喝茶。", "今天北京天气很好。",
            "我们明天去上海。", "上海是中国最大的城市。", "我们都喜欢中国的城市。", "北京的天气今天很好。",
            "他们明天去北京喝茶。", "中国的首都是北京。", "你喜欢上海还是北京？", "秋天的北京很美。"]
    return tokenizers.train_sentencepiece(text * 20, 55, str(tmp_path_factory.mktemp("spm")),
                                          byte_fallback=False)


@pytest.mark.parametrize("which", ["wordpiece", "sentencepiece"])
def test_each_chinese_character_labels_its_own_piece(which, tokenizer, chinese_sentencepiece):
    tok = tokenizer if which == "wordpiece" else chinese_sentencepiece
    if which == "sentencepiece":  # what the issue found: alone, '京' is '▁' + '京'
        assert tok.tokenize("京") == ["\u2581", "京"]
        assert "北京" in [tok.id_to_token(i) for i in range(tok.vocab_size)]
    chars = list("北京上海中国的天")  # in both vocabularies
    sentence = TaggedSentence("s", chars, ["B", "E", "B", "E", "B", "E", "S", "S"])
    features = tagging_features([sentence], tok, 32, tag_vocab([sentence]))
    labelled = [tok.id_to_token(int(i)) for i in _labelled_pieces(features)]
    assert labelled == chars  # one distinct piece per character: the character itself
    # Inside the sentence no character carries a word-start mark; the first one may.
    ids = features.arrays["input_ids"][0][1:features.arrays["input_mask"][0].sum() - 1]
    assert "\u2581" not in "".join(tok.id_to_token(int(i)) for i in ids[1:])


def test_sentencepiece_english_word_labels_the_piece_after_a_bare_word_start(
        chinese_sentencepiece):
    tok = chinese_sentencepiece  # knows no English: 'Emma' is '▁' + letters
    emma = tok.encode("Emma")
    assert tok.id_to_token(emma[0]) == "\u2581" and len(emma) == 2
    sentence = TaggedSentence("s", ["Emma", "北京"], ["B-PER", "B-LOC"])
    features = tagging_features([sentence], tok, 32, tag_vocab([sentence]))
    assert features.arrays["input_ids"][0][1] == emma[0]  # the input keeps the word start
    labelled = _labelled_pieces(features).tolist()
    assert labelled == [emma[1], tok.token_to_id("\u2581北京")]


def test_sentences_that_fit_are_one_row_with_labels_at_first_pieces(tokenizer):
    words = ["Johanson", "visited", "Tegucigalpa", "today"]
    sentence = TaggedSentence("s", words, ["B-PER", "O", "B-LOC", "O"])
    vocab = tag_vocab([sentence])
    pieces = [tokenizer.encode(w) for w in words]
    n = sum(map(len, pieces))
    features = tagging_features([sentence], tokenizer, n + 2, vocab, stride=1)  # just fits
    assert len(features) == 1 and features.stats["windowed"] == 0
    expected = [-1] + sum(([vocab.id(t, "")] + [-1] * (len(p) - 1)
                           for p, t in zip(pieces, sentence.tags)), [])
    np.testing.assert_array_equal(features.arrays["label_ids"][0][:n + 1], expected)


def test_long_sentences_are_windowed_and_every_word_scored_once(tokenizer):
    words = [f"word{i}" for i in range(40)] + ["\u200b"]  # a word of nothing becomes [UNK]
    tags = ["B-X" if i % 3 == 0 else "O" for i in range(len(words))]
    sentences = [TaggedSentence("a", words, tags), TaggedSentence("b", ["short"], ["O"])]
    vocab = tag_vocab(sentences)
    features = tagging_features(sentences, tokenizer, 12, vocab, stride=4)
    rows = features.arrays["example_index"] == 0
    assert features.stats["windowed"] == 1 and rows.sum() > 10
    assert (features.arrays["input_mask"].sum(1) <= 12).all()
    # Windows overlap (stride 4 in a 10-piece budget), yet each word is labelled in one row.
    scored = features.arrays["word_ids"][rows]
    assert sorted(scored[scored >= 0].tolist()) == list(range(len(words)))
    # ...the one where it sits farthest from either edge, not at a row's end when avoidable.
    first_row = features.arrays["word_ids"][np.flatnonzero(rows)[1]]
    positions = np.flatnonzero(first_row >= 0)
    assert positions.min() > 1 and positions.max() < features.arrays["input_mask"][1].sum() - 2
    # Feeding the gold ids back as "predictions" must give every word its own tag.
    recovered = word_predictions(features, np.maximum(features.arrays["label_ids"], 0), sentences)
    assert [vocab.labels[i] for i in recovered[0]] == tags
    assert [vocab.labels[i] for i in recovered[1]] == ["O"]
