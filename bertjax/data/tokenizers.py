"""One Tokenizer interface over WordPiece (BERT vocab.txt) and SentencePiece models.

WordPiece is BERT's: basic tokenization (clean text, optional lower casing and accent
stripping, punctuation split, CJK characters as single tokens) then greedy longest-match
WordPiece with `##` continuations, words over 100 characters -> [UNK]. It runs on the Hugging
Face `tokenizers` library (the maintained Rust implementation) configured to give the same ids
as `transformers.BertTokenizer`. SentencePiece models are the default for new models:
`train_sentencepiece` trains one with the BERT special tokens at ids 0-4.
"""

from __future__ import annotations

import abc
import io
import os
import random
import re
import sys
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bertjax import files

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

WORDPIECE_VOCAB = "vocab.txt"
WORDPIECE_CONFIG = "tokenizer_config.json"  # Hugging Face's name, so their files load as-is
SENTENCEPIECE_MODEL = "spm.model"
SENTENCEPIECE_VOCAB = "spm.vocab"


class Tokenizer(abc.ABC):
    """Text <-> token ids, without adding special tokens (the pipelines place [CLS]/[SEP])."""

    kind: str  # "wordpiece" or "sentencepiece", recorded in shard manifests
    file_name: str  # the file `save` writes that `load_tokenizer` reads back
    lowercase: bool

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_batch_unspaced(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of texts as they read straight after other text, with no space between (a
        character inside a Chinese sentence). Only tokenizers that mark word starts differ
        from `encode_batch` here."""
        return self.encode_batch(texts)

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[str]: ...

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str: ...

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abc.abstractmethod
    def save(self, directory: str) -> list[str]:
        """Copies the vocabulary file(s) into `directory`; returns the written paths."""

    @abc.abstractmethod
    def word_start_table(self) -> np.ndarray:
        """bool [vocab_size]: True where a token begins a word (for whole-word masking)."""

    @property
    def pad_id(self) -> int:
        return self._special("[PAD]")

    @property
    def unk_id(self) -> int:
        return self._special("[UNK]")

    @property
    def cls_id(self) -> int:
        return self._special("[CLS]")

    @property
    def sep_id(self) -> int:
        return self._special("[SEP]")

    @property
    def mask_id(self) -> int:
        return self._special("[MASK]")

    def special_ids(self) -> dict[str, int]:
        return {t: self._special(t) for t in SPECIAL_TOKENS}

    def describe(self) -> dict:
        """What a shard manifest records about the tokenizer."""
        return {"type": self.kind, "file": self.file_name, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids(), "lowercase": self.lowercase}

    def _special(self, token: str) -> int:
        token_id = self.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{self!r}: vocabulary has no {token} token; BERT needs "
                             f"all of {', '.join(SPECIAL_TOKENS)}")
        return token_id


def _require_specials(tokenizer: Tokenizer, path: str) -> None:
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"tokenizer {path}: missing special token(s) {', '.join(missing)}; "
                         f"BERT needs all of {', '.join(SPECIAL_TOKENS)}")


# ---------------------------------------------------------------------------------------------
# WordPiece


_unassigned_pattern: re.Pattern | None = None


def _drop_unassigned(text: str) -> str:
    """Removes unassigned, private-use and surrogate code points (categories Cn Co Cs).

    BERT's text cleaning drops every category-C character; the Rust normalizer misses the
    unassigned ones, and lone surrogates cannot cross into Rust at all.
    """
    global _unassigned_pattern
    if text.isascii():
        return text
    if _unassigned_pattern is None:
        ranges, start = [], None
        for cp in range(sys.maxunicode + 2):
            drop = cp <= sys.maxunicode and unicodedata.category(chr(cp)) in ("Cn", "Co", "Cs")
            if drop and start is None:
                start = cp
            elif not drop and start is not None:
                ranges.append(f"\\U{start:08x}-\\U{cp - 1:08x}")
                start = None
        _unassigned_pattern = re.compile("[" + "".join(ranges) + "]")
    return _unassigned_pattern.sub("", text)


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece from a vocab.txt; the same ids as `transformers.BertTokenizer`.

    `strip_accents=None` follows `lowercase`, as in BERT: uncased vocabularies strip accents,
    cased ones keep them. Text never yields a special id: "[SEP]" written in a document is
    `[`, `sep`, `]`, as google-research/bert's tokenizer has it, so a corpus cannot forge a
    separator or an untargeted mask (`transformers.BertTokenizer` instead maps it to the
    special id). Fill-mask prompts place their mask ids themselves (`predict.encode_masked`).
    Where the Rust library's
    Unicode tables and Python's disagree (a few rare punctuation marks in cased mode, characters
    newer than the Rust tables) the ids follow the Rust library, as `BertTokenizerFast` does.
    """

    kind = "wordpiece"
    file_name = WORDPIECE_VOCAB

    def __init__(self, vocab_file: str, lowercase: bool = True, strip_accents: bool | None = None,
                 handle_chinese_chars: bool = True, max_input_chars_per_word: int = 100):
        from tokenizers import decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as RustTokenizer

        self.path = vocab_file = os.fspath(vocab_file)
        try:
            text = files.read_text(vocab_file)
        except FileNotFoundError:
            raise FileNotFoundError(f"WordPiece vocabulary {vocab_file!r} not found") from None
        # One token per line, id = line number, as transformers' load_vocab reads it.
        self._tokens = text.split("\n")
        if self._tokens and self._tokens[-1] == "":
            self._tokens.pop()
        if not self._tokens:
            raise ValueError(f"WordPiece vocabulary {vocab_file!r} is empty")
        self._vocab = {t: i for i, t in enumerate(self._tokens)}
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.handle_chinese_chars = handle_chinese_chars
        _require_specials(self, vocab_file)

        tok = RustTokenizer(models.WordPiece(
            self._vocab, unk_token="[UNK]", max_input_chars_per_word=max_input_chars_per_word))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=handle_chinese_chars,
            strip_accents=strip_accents, lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        self._tok = tok

    def __repr__(self) -> str:
        return f"WordPieceTokenizer({self.path!r}, lowercase={self.lowercase})"

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(_drop_unassigned(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = [_drop_unassigned(t) for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def tokenize(self, text: str) -> list[str]:
        return self._tok.encode(_drop_unassigned(text), add_special_tokens=False).tokens

    def id_to_token(self, token_id: int) -> str:
        return self._tokens[token_id]

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def word_start_table(self) -> np.ndarray:
        """A token starts a word unless it is a `##` continuation; special tokens start one."""
        return np.array([not t.startswith("##") for t in self._tokens], dtype=bool)

    def save(self, directory: str) -> list[str]:
        directory = os.fspath(directory)
        vocab_path = os.path.join(directory, WORDPIECE_VOCAB)
        config_path = os.path.join(directory, WORDPIECE_CONFIG)
        files.write_text(vocab_path, "\n".join(self._tokens) + "\n")
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.handle_chinese_chars}
        files.write_json(config_path, config, indent=2)
        return [vocab_path, config_path]


# ---------------------------------------------------------------------------------------------
# SentencePiece

# Piece types of sentencepiece_model.proto.
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6


def is_cjk_ideograph(cp: int) -> bool:
    """The CJK ideograph ranges BERT's basic tokenizer makes single tokens."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _is_unspaced(char: str) -> bool:
    """CJK ideographs and Japanese kana: scripts written without spaces between words."""
    cp = ord(char)
    return is_cjk_ideograph(cp) or 0x3040 <= cp <= 0x30FF


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model` that holds the BERT special tokens as pieces.

    Text never yields a special id. SentencePiece matches user-defined pieces inside the text,
    so a model that declares [CLS], [SEP] or [MASK] that way (the usual recipe for BERT
    vocabularies, and how bertjax trained them before) would turn "[SEP]" in a document into
    a separator; such pieces are loaded as control pieces, which keep their ids but are never
    produced from text. `num_threads` is what `encode_batch` uses (-1: one per core).
    """

    kind = "sentencepiece"
    file_name = SENTENCEPIECE_MODEL
    num_threads = -1

    def __init__(self, model_file: str, _model_proto: bytes | None = None):
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2

        self.path = model_file = os.fspath(model_file)
        if _model_proto is None:
            try:
                _model_proto = files.read_bytes(model_file)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"SentencePiece model {model_file!r} not found") from None
        self._proto = sentencepiece_model_pb2.ModelProto()
        try:
            self._proto.ParseFromString(_model_proto)
            forgeable = [p for p in self._proto.pieces
                         if p.piece in SPECIAL_TOKENS and p.type == _USER_DEFINED]
            for piece in forgeable:
                piece.type = _CONTROL
            if forgeable:
                _model_proto = self._proto.SerializeToString()
            self._sp = spm.SentencePieceProcessor(model_proto=_model_proto)
        except Exception as e:  # protobuf DecodeError or sentencepiece's RuntimeError
            raise ValueError(f"{model_file!r} is not a SentencePiece model: {e}") from None
        self.lowercase = self._proto.normalizer_spec.name.endswith("_cf")
        self._sp_unspaced = None
        _require_specials(self, model_file)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.path!r})"

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int, num_threads=self.num_threads)

    def encode_batch_unspaced(self, texts: Sequence[str]) -> list[list[int]]:
        """Without the `▁` SentencePiece puts before a text's first piece (its dummy prefix):
        the same model with that one normalizer setting off."""
        if self._sp_unspaced is None:
            import sentencepiece as spm
            from sentencepiece import sentencepiece_model_pb2

            proto = sentencepiece_model_pb2.ModelProto()
            proto.CopyFrom(self._proto)
            proto.normalizer_spec.add_dummy_prefix = False
            self._sp_unspaced = spm.SentencePieceProcessor(
                model_proto=proto.SerializeToString())
        return self._sp_unspaced.encode(list(texts), out_type=int,
                                        num_threads=self.num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def tokenize(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)

    def id_to_token(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        token_id = self._sp.piece_to_id(token)
        return token_id if self._sp.id_to_piece(token_id) == token else None

    def word_start_table(self) -> np.ndarray:
        """Which pieces begin a word.

        A piece starts a word if it is a special, unknown or control piece, starts with `▁`
        (SentencePiece's mark for a preceding space), consists only of punctuation or symbols
        (SentencePiece emits these unspaced: "Hi," -> "▁Hi", ","), or starts with a CJK
        ideograph or kana (unspaced scripts: each such piece is a word, as each CJK character
        is in BERT). Byte-fallback pieces continue the word they are in. The table is per
        piece, so a piece that follows punctuation ("'", "s") continues the punctuation's word.
        """
        table = np.zeros(self.vocab_size, dtype=bool)
        for i, piece in enumerate(self._proto.pieces):
            text = piece.piece
            if piece.type == _BYTE:
                continue
            table[i] = (piece.type != _NORMAL or not text or text.startswith("\u2581")
                        or all(unicodedata.category(c)[0] in "PS" for c in text)
                        or _is_unspaced(text[0]))
        return table

    def save(self, directory: str) -> list[str]:
        directory = os.fspath(directory)
        model_path = os.path.join(directory, SENTENCEPIECE_MODEL)
        vocab_path = os.path.join(directory, SENTENCEPIECE_VOCAB)
        files.write_bytes(model_path, self._sp.serialized_model_proto())
        vocab = "".join(f"{p.piece}\t{p.score:g}\n" for p in self._proto.pieces)
        files.write_text(vocab_path, vocab)
        return [model_path, vocab_path]


def train_sentencepiece(sentences: Iterable[str], vocab_size: int, output_dir: str,
                        model_type: str = "unigram", lowercase: bool = False,
                        max_sentences: int = 1_000_000, character_coverage: float = 0.9995,
                        byte_fallback: bool = True, num_threads: int = 4,
                        seed: int = 0) -> SentencePieceTokenizer:
    """Trains a SentencePiece model with [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.

    Characters outside `character_coverage` (rare ones; the default suits CJK text too) are
    spelled as UTF-8 byte pieces with `byte_fallback`, which costs 256 ids and makes every text
    encodable without [UNK] and decodable exactly.

    At most `max_sentences` sentences are used, a uniform sample (reservoir, seeded) when the
    corpus has more. The result depends only on the input and the arguments: sampling is seeded
    and the thread count is fixed rather than taken from the machine (SentencePiece's result
    changes with it). Writes spm.model and spm.vocab into `output_dir` atomically.
    """
    import sentencepiece as spm

    output_dir = os.fspath(output_dir)
    rng = random.Random(seed)
    sample: list[str] = []
    for n, sentence in enumerate(s for s in sentences if s.strip()):
        if len(sample) < max_sentences:
            sample.append(sentence)
        else:
            j = rng.randrange(n + 1)
            if j < max_sentences:
                sample[j] = sentence
    if not sample:
        raise ValueError("cannot train a SentencePiece model: the corpus has no sentences")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
            control_symbols=["[CLS]", "[SEP]", "[MASK]"], input_sentence_size=0,
            num_threads=num_threads, minloglevel=2)
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training with vocab_size={vocab_size} failed on "
                         f"{len(sample)} sentences: {e}") from None
    tokenizer = SentencePieceTokenizer(os.path.join(output_dir, SENTENCEPIECE_MODEL),
                                       _model_proto=model.getvalue())
    tokenizer.save(output_dir)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Loading


def load_tokenizer(path: str) -> Tokenizer:
    """A vocab.txt (or a directory with one) or a SentencePiece .model (or a directory with
    spm.model) -> the tokenizer. A WordPiece `do_lower_case`/`strip_accents` is read from a
    tokenizer_config.json beside the vocab.txt; without one the vocabulary is taken as uncased.
    """
    path = os.fspath(path)
    if files.path(path).is_dir():
        candidates = [os.path.join(path, n) for n in (WORDPIECE_VOCAB, SENTENCEPIECE_MODEL)]
        found = [c for c in candidates if files.path(c).exists()]
        if len(found) != 1:
            what = "both" if found else "neither"
            raise FileNotFoundError(f"tokenizer directory {path!r} holds {what} of "
                                    f"{WORDPIECE_VOCAB} and {SENTENCEPIECE_MODEL}; expected one")
        path = found[0]
    if not files.path(path).exists():
        raise FileNotFoundError(f"tokenizer {path!r} not found: expected a vocab.txt, a "
                                "SentencePiece .model, or a directory holding one")
    if path.endswith(".model"):
        return SentencePieceTokenizer(path)
    if path.endswith(".txt"):
        config_path = os.path.join(os.path.dirname(path), WORDPIECE_CONFIG)
        config = {}
        if files.path(config_path).exists():
            config = files.read_json(config_path)
        lowercase = config.get("do_lower_case", True)
        return WordPieceTokenizer(path, lowercase=lowercase,
                                  strip_accents=config.get("strip_accents"),
                                  handle_chinese_chars=config.get("tokenize_chinese_chars", True))
    raise ValueError(f"tokenizer {path!r}: expected a WordPiece vocab .txt or a SentencePiece "
                     ".model file")
