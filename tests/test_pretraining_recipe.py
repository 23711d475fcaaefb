"""Each rule of BERT's pair and mask recipe, checked on its own against the original's logic.

google-research/bert `create_pretraining_data.py` is the reference. Pairs are checked on the
spans `pairs.nsp_spans` returns before truncation (so every draw can be read back from them),
masking on `masking.mask_batch`, and the whole pipeline only for what needs it (how many
documents a batch mixes). Statistical checks use fixed seeds and a chi-square test at
p > 1e-4: a rule that is off shows as a p-value of zero, not as a flake.
"""
import random

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from bertjax.data import examples, masking, pairs, pretraining, shards


def pool_of(documents):
    """PoolTensors of documents given as lists of sentence lengths; every document one part.
    Token t of the pool has id t, so spans index the pool directly."""
    lengths = [n for doc in documents for n in doc]
    sentence_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    document_starts = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(
        np.int64)
    parts = examples.document_parts(sentence_starts, document_starts, sentence_starts[-1] + 1)
    return pairs.PoolTensors(tf.range(sentence_starts[-1], dtype=tf.int32),
                             tf.constant(sentence_starts), tf.constant(document_starts),
                             *map(tf.constant, parts))


def spans_over_seeds(documents, max_num_tokens, seeds, short_seq_prob=0.1):
    """Every document's instances for each seed: dict of int arrays (a0 a1 b0 b1 label target
    doc), spans before truncation."""
    pool = pool_of(documents)
    out = {k: [] for k in ("a0", "a1", "b0", "b1", "label", "target", "doc")}
    for seed in seeds:
        spans, target = pairs.nsp_spans(tf.range(len(documents)), tf.constant([seed, 1],
                                        tf.int64), pool, max_num_tokens=max_num_tokens,
                                        short_seq_prob=short_seq_prob)
        for key, value in (("a0", spans.a0), ("a1", spans.a1), ("b0", spans.b0),
                           ("b1", spans.b1), ("label", spans.next_sentence_labels),
                           ("target", target)):
            out[key].append(value.numpy())
        out["doc"].append(np.searchsorted(pool.sentence_starts.numpy()[
            pool.document_starts.numpy()], spans.a0.numpy(), side="right") - 1)
    out = {k: np.concatenate(v) for k, v in out.items()}
    return out, pool.sentence_starts.numpy(), pool.document_starts.numpy()


def uniform(counts):
    """p-value of the counts under a uniform distribution over their bins."""
    return stats.chisquare(counts).pvalue


def sentence_documents(rng, count, sentences, low=1, high=13):
    return [list(rng.integers(low, high, size=sentences)) for _ in range(count)]


def test_a_end_is_uniform_within_the_chunk():
    docs = sentence_documents(np.random.default_rng(0), 20, 300)
    s, sent, _ = spans_over_seeds(docs, max_num_tokens=29, seeds=range(10))
    true_next = s["label"] == 0  # the whole chunk is visible: A then B
    a_sentences = np.searchsorted(sent, s["a1"]) - np.searchsorted(sent, s["a0"])
    chunk = np.searchsorted(sent, s["b1"]) - np.searchsorted(sent, s["a0"])
    checked = 0
    for n in range(2, 12):
        a = a_sentences[true_next & (chunk == n)]
        if len(a) < 50 * (n - 1):
            continue
        # a_end uniform in [1, n - 1], as the original's rng.randint(1, len(chunk) - 1).
        assert a.min() >= 1 and a.max() <= n - 1
        if n > 2:
            assert uniform(np.bincount(a, minlength=n)[1:]) > 1e-4, n
            checked += 1
    assert checked >= 4


def test_a_one_sentence_chunk_always_gets_a_random_next():
    rng = np.random.default_rng(1)
    # Sentences as long as the target fill a chunk alone; short ones around them do not.
    docs = [[int(x) for x in rng.choice([3, 30], size=60, p=[0.7, 0.3])] for _ in range(20)]
    docs += [[7]] * 4  # one-sentence documents: one-sentence chunks too
    s, sent, _ = spans_over_seeds(docs, max_num_tokens=29, seeds=range(5))
    one_sentence = ((s["a1"] - s["a0"] >= s["target"])
                    & (np.searchsorted(sent, s["a1"]) - np.searchsorted(sent, s["a0"]) == 1))
    one_sentence |= s["doc"] >= 20
    assert one_sentence.sum() > 500
    assert (s["label"][one_sentence] == 1).all()
    # Chunks of several sentences still toss the coin.
    assert abs(s["label"][~one_sentence].mean() - 0.5) < 0.03


def test_random_next_is_a_uniform_other_document_from_a_uniform_sentence():
    docs = [[3] * 400 for _ in range(8)]  # equal documents: every draw shows in the counts
    s, sent, doc_starts = spans_over_seeds(docs, max_num_tokens=20, seeds=range(30))
    r = s["label"] == 1
    a0, a1, b0, b1, target, doc = (s[k][r] for k in ("a0", "a1", "b0", "b1", "target", "doc"))
    assert len(b0) > 5000
    other = np.searchsorted(sent[doc_starts], b0, side="right") - 1
    assert (other != doc).all(), "B always comes from another document"
    # Uniform over the 7 other documents: the offset from A's document, mod 8.
    assert uniform(np.bincount((other - doc) % 8, minlength=8)[1:]) > 1e-4
    start = np.searchsorted(sent, b0) - doc_starts[other]
    assert uniform(np.bincount(start, minlength=400)) > 1e-4
    # Filled with whole sentences until B reaches target - len(A) (at least one sentence),
    # or its document ends.
    wanted = np.maximum(target - (a1 - a0), 1)
    other_end = sent[doc_starts[other + 1]]
    assert (np.isin(b1, sent)).all()
    reached = b1 - b0 >= wanted
    assert (reached | (b1 == other_end)).all()
    assert (b1 - 3 - b0 < wanted).all(), "no sentence more than needed"
    assert reached.mean() > 0.8


def original_truncation(la, lb, limit):
    """The original's truncate_seq_pair on lengths: tokens dropped from A and from B."""
    drop_a = drop_b = 0
    while la + lb > limit:
        if la > lb:
            la, drop_a = la - 1, drop_a + 1
        else:
            lb, drop_b = lb - 1, drop_b + 1
    return drop_a, drop_b


def test_truncation_trims_the_longer_side_front_or_back_at_random():
    grid = [(la, lb, t) for la in range(1, 30, 2) for lb in range(1, 30, 3)
            for t in (2, 7, 16, 25)]
    la, lb, target = (np.array(x, np.int64) for x in zip(*grid))
    base = 1000 * np.arange(len(grid), dtype=np.int64)
    spans = pairs.Spans(tf.constant(base), tf.constant(base + la), tf.constant(base + 500),
                        tf.constant(base + 500 + lb), tf.zeros(len(grid), tf.int32))
    front = {"a": 0, "b": 0}
    dropped = {"a": 0, "b": 0}
    for seed in range(20):
        out = pairs.truncate_pair(spans, tf.constant(target), tf.constant([seed, 2], tf.int64))
        a0, a1, b0, b1 = (x.numpy() for x in (out.a0, out.a1, out.b0, out.b1))
        # Truncated to the target (the original: to max_num_tokens; see pairs.py).
        want = np.array([original_truncation(*row) for row in grid])
        np.testing.assert_array_equal(la - (a1 - a0), want[:, 0])
        np.testing.assert_array_equal(lb - (b1 - b0), want[:, 1])
        front["a"] += (a0 - base).sum()
        front["b"] += (b0 - base - 500).sum()
        dropped["a"] += want[:, 0].sum()
        dropped["b"] += want[:, 1].sum()
    # Each dropped token from the front or the back with probability 1/2.
    for side in "ab":
        assert dropped[side] > 2000
        assert stats.binomtest(int(front[side]), int(dropped[side])).pvalue > 1e-4


def test_nine_in_ten_targets_are_full_length():
    docs = sentence_documents(np.random.default_rng(2), 30, 400)
    s, _, _ = spans_over_seeds(docs, max_num_tokens=61, seeds=range(8))
    target = s["target"]
    # Full with probability 0.9; else uniform in [2, 61], which is 61 one time in 60.
    full = np.mean(target == 61)
    assert abs(full - (0.9 + 0.1 / 60)) < 0.01
    short = target[target < 61]
    assert short.min() >= 2 and uniform(np.bincount(short, minlength=61)[2:]) > 1e-4


def original_instances(sentences, rng, max_num_tokens, short_seq_prob, per_instance):
    """How many instances the original's `create_instances_from_document` loop makes from a
    document (sentence lengths), written from its logic: the target is drawn once per
    document, or with `per_instance` again after each instance (bertjax's deliberate
    difference). A random next puts the chunk's unused sentences back."""
    def draw():
        return rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens

    target, count, chunk, length, i = draw(), 0, 0, 0, 0
    while i < len(sentences):
        chunk, length = chunk + 1, length + sentences[i]
        if i == len(sentences) - 1 or length >= target:
            a_end = rng.randint(1, chunk - 1) if chunk >= 2 else 1
            if chunk == 1 or rng.random() < 0.5:
                i -= chunk - a_end
            count += 1
            chunk = length = 0
            if per_instance:
                target = draw()
        i += 1
    return count


@pytest.mark.parametrize("seq_len,short_seq_prob", [(128, 0.0), (512, 0.0), (128, 0.1),
                                                    (512, 0.1)])
def test_instances_per_document_match_the_original(seq_len, short_seq_prob):
    """With no short targets (where per document and per instance agree), as many instances
    per document and epoch as the original's loop makes; with short targets, as many as that
    loop drawing them per instance, bertjax's deliberate difference, and 2-15% fewer than the
    original's per-document draw makes (pairs.py states 5-11%)."""
    rng = np.random.default_rng(3)
    docs = [[int(x) for x in np.clip(rng.lognormal(3.0, 0.6, rng.integers(1, 120)), 1, 300)]
            for _ in range(300)]
    seeds = range(12)
    s, _, _ = spans_over_seeds(docs, seq_len - 3, seeds, short_seq_prob)
    ours = len(s["a0"]) / len(seeds)
    py = random.Random(0)

    def theirs(per_instance):
        return np.mean([sum(original_instances(d, py, seq_len - 3, short_seq_prob,
                                               per_instance) for d in docs) for _ in seeds])

    assert abs(ours / theirs(per_instance=short_seq_prob > 0) - 1) < 0.02
    if short_seq_prob:
        assert 0.85 < ours / theirs(per_instance=False) < 0.98


def masked(lengths, seed, **kw):
    """mask_batch on rows [CLS] text [SEP] text [SEP] of ids 10, 11, ... (specials 0-4)."""
    width = max(lengths)
    pos = np.arange(width)[None]
    text = (pos >= 1) & (pos < np.array(lengths)[:, None] - 1) & (pos != 5)
    ids = np.where(text, 10 + pos, np.where(pos < np.array(lengths)[:, None], 3, 0))
    ids[:, 0] = 2
    args = dict(max_predictions=20, mask_rate=0.15, mask_prob=0.8, random_prob=0.1,
                mask_id=4, random_ids=tf.range(5, 60))
    args.update(kw)
    out = masking.mask_batch(tf.constant(ids, tf.int32), tf.constant(text),
                             tf.constant(lengths, tf.int32), tf.constant([seed, 3], tf.int64),
                             **args)
    return {k: v.numpy() for k, v in out.items()}, ids, text


def test_number_of_predictions_counts_the_special_tokens():
    lengths = np.arange(8, 129)
    out, _, text = masked(lengths, 0, max_predictions=20)
    count = out["masked_lm_weights"].sum(1)
    # round(len(tokens) * 0.15), len(tokens) with [CLS] and both [SEP], as the original.
    want = [min(20, max(1, int(round(n * 0.15)))) for n in lengths]
    np.testing.assert_array_equal(count, want)
    out, _, _ = masked([512], 0, max_predictions=80)
    assert out["masked_lm_weights"].sum() == 77  # round(509 * 0.15) would be 76


def test_masked_positions_are_spread_evenly():
    out, ids, text = masked([40] * 4000, 1)
    rows, slots = np.nonzero(out["masked_lm_weights"])
    positions = out["masked_lm_positions"][rows, slots]
    assert text[rows, positions].all(), "never [CLS] or [SEP]"
    counts = np.bincount(positions, minlength=40)[text[0]]
    assert counts.sum() == 4000 * 6 and uniform(counts) > 1e-4


def test_random_replacements_are_uniform_over_the_non_special_vocabulary():
    vocab = pretraining.Vocab(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
    out, ids, _ = masked([40] * 3000, 2, mask_prob=0.0, random_prob=1.0,
                         random_ids=tf.constant(vocab.random_ids()))
    rows, slots = np.nonzero(out["masked_lm_weights"])
    replaced = out["input_ids"][rows, out["masked_lm_positions"][rows, slots]]
    assert not np.isin(replaced, list(vocab.special_ids().values())).any()
    counts = np.bincount(replaced, minlength=60)
    assert (counts[5:] > 0).all() and uniform(counts[5:]) > 1e-4


def test_a_batch_mixes_many_documents_even_when_they_are_books(tmp_path):
    """Documents (books) each far larger than a batch's worth: 40 documents of 20,000 tokens,
    blocks of 65,536 tokens. Whole documents would put three or four in a block, and every
    batch would come from those; visited in parts, a batch of 64 draws from dozens."""
    rng = np.random.default_rng(4)
    docs = []
    for d in range(40):
        lengths = np.clip(rng.lognormal(3.0, 0.6, 1000).astype(int), 1, 300)
        lengths = lengths[:np.searchsorted(np.cumsum(lengths), 20_000)]
        docs.append([[10 + d] * int(n) for n in lengths])
    shards.write_documents(str(tmp_path), docs, num_shards=2)
    vocab = pretraining.Vocab(size=60, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
    it = pretraining.pretraining_dataset(str(tmp_path), vocab=vocab, max_seq_length=64,
                                         max_predictions_per_seq=10, global_batch_size=64,
                                         seed=0, shuffle_tokens=1 << 16)
    distinct = []
    for _ in range(30):
        batch = next(it)
        first = batch["input_ids"][:, 1]  # A's first token says its document, unless masked
        masked_first = batch["masked_lm_positions"] == 1
        restored = np.where(masked_first.any(1), batch["masked_lm_ids"][:, 0], first)
        distinct.append(len(set(restored.tolist())))
    assert min(distinct) >= 16, distinct
