"""The pretraining pipeline builds BERT's pairs exactly, deterministically and resumably.

Synthetic documents make every check exact: token id = 10 + 1500 * document + position in the
document, so each output token says where it came from. Masking statistics on real text are
in test_pretraining_masking.py.
"""
import json

import numpy as np
import pytest

from bertjax.data import document_pool, pretraining, shards

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
STRIDE, BASE = 1500, 10
VOCAB = pretraining.Vocab(size=BASE + 40 * STRIDE, pad_id=PAD, unk_id=UNK, cls_id=CLS,
                          sep_id=SEP, mask_id=MASK)
L, P = 64, 10


def _synthetic_documents(count=40, seed=0):
    """Mostly short sentences (so nearly every chunk has several), plus edge cases: one-
    sentence documents and sentences longer than a whole sequence."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(count):
        if d in (7, 21):
            lengths = [5 if d == 7 else 30]
        else:
            lengths = list(rng.integers(1, 13, size=rng.integers(10, 200)))
            if d in (3, 15, 33):
                lengths.insert(len(lengths) // 2, 150)
        lengths = lengths[:np.searchsorted(np.cumsum(lengths), STRIDE, side="right")]
        pos, doc = 0, []
        for n in lengths:
            doc.append([BASE + d * STRIDE + pos + i for i in range(n)])
            pos += n
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = _synthetic_documents()
    directory = str(tmp_path_factory.mktemp("synthetic"))
    shards.write_documents(directory, docs, num_shards=4)
    sentence_starts = {d: np.cumsum([0] + [len(s) for s in doc]) for d, doc in enumerate(docs)}
    return directory, docs, sentence_starts


@pytest.fixture(scope="module")
def stream(corpus):
    """The first 700 batches (11,200 examples) of the default pipeline, and position() after
    each of them."""
    it = _dataset(corpus[0])
    batches, positions = [], []
    for _ in range(700):
        batches.append(next(it))
        positions.append(it.position())
    return batches, positions


def _dataset(directory, **kw):
    args = dict(vocab=VOCAB, max_seq_length=L, max_predictions_per_seq=P, global_batch_size=16,
                seed=3, shuffle_tokens=4096)
    args.update(kw)
    return pretraining.pretraining_dataset(directory, **args)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _stack(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _unmasked(ex):
    ids = ex["input_ids"].copy()
    rows, slots = np.nonzero(ex["masked_lm_weights"])
    ids[rows, ex["masked_lm_positions"][rows, slots]] = ex["masked_lm_ids"][rows, slots]
    return ids


def _split(row, nsp=True):
    """[CLS] A [SEP] B [SEP] -> (A, B) as arrays of original ids, checking the layout."""
    seps = np.flatnonzero(row == SEP)
    assert row[0] == CLS and len(seps) == (2 if nsp else 1)
    assert not np.isin(row[1:seps[-1]], [CLS, PAD]).any()
    assert (row[seps[-1] + 1:] == PAD).all()
    return row[1:seps[0]], (row[seps[0] + 1:seps[1]] if nsp else row[:0])


def _where(tokens):
    return (tokens - BASE) // STRIDE, (tokens - BASE) % STRIDE


def _sentence_of(sentence_starts, doc, pos):
    return np.searchsorted(sentence_starts[doc], pos, side="right") - 1


def test_pairs_follow_the_original_recipe(corpus, stream):
    _, docs, starts = corpus
    ex = _stack(stream[0])
    ids = _unmasked(ex)
    stats = {"random": 0, "short": 0, "unconstrained": 0}
    short_lengths = []
    cuts = {"front": 0, "back": 0}
    for i, row in enumerate(ids):
        a, b = _split(row)
        (doc_a, pos_a), (doc_b, pos_b) = _where(a), _where(b)
        length = len(a) + len(b)
        assert len(a) >= 1 and len(b) >= 1 and length <= L - 3
        # Each segment is one contiguous run of one document.
        assert (doc_a == doc_a[0]).all() and (np.diff(pos_a) == 1).all()
        assert (doc_b == doc_b[0]).all() and (np.diff(pos_b) == 1).all()
        # Segments are whole sentences until truncation cuts the front or the back.
        for doc, pos in ((doc_a, pos_a), (doc_b, pos_b)):
            cuts["front"] += pos[0] not in starts[doc[0]]
            cuts["back"] += pos[-1] + 1 not in starts[doc[0]]
        label = ex["next_sentence_labels"][i]
        if label == 1:
            stats["random"] += 1
            assert doc_b[0] != doc_a[0], "a random next sentence must come from another document"
        else:
            # The true continuation: same document, B after A, split at a sentence boundary.
            assert doc_b[0] == doc_a[0] and pos_b[0] > pos_a[-1]
            s_last_a = _sentence_of(starts, doc_a[0], pos_a[-1])
            s_first_b = _sentence_of(starts, doc_a[0], pos_b[0])
            assert s_first_b > s_last_a
            assert starts[doc_a[0]][s_last_a + 1] <= pos_b[0]
        # Unless B ran into the end of its document, a pair is truncated to exactly its target:
        # L - 3, or with probability 0.1 a uniform length in [2, L - 3].
        last_sentence_start = starts[doc_b[0]][-2]
        if pos_b[-1] < last_sentence_start:
            stats["unconstrained"] += 1
            if length < L - 3:
                stats["short"] += 1
                short_lengths.append(length)
        # Segment ids, input mask and padding agree with the layout.
        n = length + 3
        np.testing.assert_array_equal(ex["input_mask"][i], np.arange(L) < n)
        np.testing.assert_array_equal(ex["segment_ids"][i],
                                      (np.arange(L) >= len(a) + 2) & (np.arange(L) < n))
    total = len(ids)
    assert abs(stats["random"] / total - 0.5) < 0.02
    assert cuts["front"] > 500 and abs(cuts["front"] / (cuts["front"] + cuts["back"]) - 0.5) < 0.03
    # A short target is uniform in [2, L-3], so it equals L - 3 in 1/(L-4) of the cases.
    expected_short = 0.1 * (L - 5) / (L - 4)
    assert stats["unconstrained"] > 0.8 * total
    assert abs(stats["short"] / stats["unconstrained"] - expected_short) < 0.015
    # ... and truncated to that target (the mean of uniform [2, L-4] is L/2 - 1).
    assert min(short_lengths) == 2 and abs(np.mean(short_lengths) - (L / 2 - 1)) < 2


def test_unused_sentences_are_put_back(corpus, stream):
    _, docs, starts = corpus
    batches, positions = stream
    # Examples of epoch 0: up to the batch after which position() first says epoch 1.
    last = next(i for i, p in enumerate(positions) if p["epoch"] == 1)
    ex = _stack(batches[:last + 1])
    ids = _unmasked(ex)[:-positions[last]["example"]]
    used = {d: np.zeros(len(doc), bool) for d, doc in enumerate(docs)}
    for row, label in zip(ids, ex["next_sentence_labels"]):
        a, b = _split(row)
        for part in (a, b) if label == 0 else (a,):
            doc, pos = _where(part)
            used[doc[0]][_sentence_of(starts, doc[0], pos)] = True
    # Without putting back, about a quarter of all sentences would be skipped (half of the
    # chunk after A, for half of the instances); truncation alone loses only a few.
    share = np.mean(np.concatenate(list(used.values())))
    assert share > 0.95


def test_same_stream_whatever_the_parallelism(corpus, stream):
    directory = corpus[0]
    reference = _stack(stream[0][:25])  # built with num_parallel_calls=AUTOTUNE
    for n in (1, 4):
        other = _stack(_take(_dataset(directory, num_parallel_calls=n), 25))
        for k in pretraining.FEATURES:
            np.testing.assert_array_equal(reference[k], other[k])
    different_seed = _stack(_take(_dataset(directory, seed=4), 25))
    assert not np.array_equal(reference["input_ids"], different_seed["input_ids"])


def test_restoring_a_position_continues_with_the_same_batches(corpus, stream):
    directory = corpus[0]
    batches, positions = stream
    epoch_end = next(i for i, p in enumerate(positions) if p["epoch"] == 1)
    # Mid-block, in a later block, and just before an epoch boundary (the next batches span it).
    for i in (2, 20, epoch_end - 2):
        saved = json.loads(json.dumps(positions[i]))
        restored = _dataset(directory, start_position=saved)
        assert restored.position() == saved
        for want, got in zip(batches[i + 1:i + 7], _take(restored, 6)):
            for k in pretraining.FEATURES:
                np.testing.assert_array_equal(want[k], got[k])


def test_hosts_read_disjoint_documents(corpus):
    directory = corpus[0]
    seen = []
    for host in range(2):
        it = _dataset(directory, process_index=host, process_count=2, global_batch_size=16)
        ex = _stack(_take(it, 40))
        assert ex["input_ids"].shape == (320, L)
        ids = _unmasked(ex)
        seen.append(set(_where(ids[(ids >= BASE)])[0].tolist()))
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    # Round-robin shards: host 0 has shards 0 and 2, i.e. documents 0, 2, 4, ...
    assert seen[0] <= set(range(0, 40, 2)) and seen[1] <= set(range(1, 40, 2))


def test_without_nsp_segments_are_contiguous_token_runs(corpus):
    directory, docs, starts = corpus
    ex = _stack(_take(_dataset(directory, nsp=False), 200))
    assert (ex["next_sentence_labels"] == 0).all() and (ex["segment_ids"] == 0).all()
    lengths, unconstrained = [], 0
    for row in _unmasked(ex):
        a, _ = _split(row, nsp=False)
        doc, pos = _where(a)
        assert (doc == doc[0]).all() and (np.diff(pos) == 1).all()
        if pos[-1] + 1 < starts[doc[0]][-1]:
            unconstrained += 1
            lengths.append(len(a))
    lengths = np.array(lengths)
    # Full runs are exactly L - 2 tokens; about 10% are short.
    assert lengths.max() == L - 2
    assert abs(np.mean(lengths < L - 2) - 0.1 * (L - 4) / (L - 3)) < 0.02


def test_heldout_documents_are_disjoint_and_eval_is_repeatable(corpus):
    directory = corpus[0]
    train = _stack(_take(_dataset(directory, heldout_fraction=0.25), 60))
    args = dict(vocab=VOCAB, max_seq_length=L, max_predictions_per_seq=P, global_batch_size=8,
                heldout_fraction=0.25)
    first = list(pretraining.eval_dataset(directory, **args))
    second = list(pretraining.eval_dataset(directory, **args))
    assert 0 < len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    heldout = _stack(first)
    docs_train = set(_where(_unmasked(train)[_unmasked(train) >= BASE])[0].tolist())
    docs_eval = set(_where(_unmasked(heldout)[_unmasked(heldout) >= BASE])[0].tolist())
    assert docs_eval and docs_train and not docs_eval & docs_train
    fixed = list(pretraining.eval_dataset(directory, num_batches=3 * len(first), **args))
    assert len(fixed) == 3 * len(first)


def _pool_documents(directory, host, hosts, heldout):
    paths = document_pool.host_shard_paths(directory, host, hosts)
    pool = document_pool.load_pool(paths, vocab_size=VOCAB.size, max_document_tokens=10**6,
                                   heldout_fraction=0.25, heldout=heldout)
    return {(pool.document(i)[0][0] - BASE) // STRIDE for i in range(pool.num_documents)}


def test_heldout_split_is_the_same_whatever_the_number_of_hosts(corpus):
    directory = corpus[0]
    for heldout in (True, False):
        one_host = _pool_documents(directory, 0, 1, heldout)
        two_hosts = [_pool_documents(directory, h, 2, heldout) for h in range(2)]
        assert one_host == two_hosts[0] | two_hosts[1] and not two_hosts[0] & two_hosts[1]
    assert 4 <= len(_pool_documents(directory, 0, 1, True)) <= 16  # about 25% of 40


def _error(match, directory, exc=ValueError, **kw):
    with pytest.raises(exc, match=match):
        _dataset(directory, **kw)


def test_bad_input_gets_a_clear_error(corpus, tmp_path):
    directory = corpus[0]
    _error("does not exist", str(tmp_path / "nowhere"), FileNotFoundError)
    _error("bertjax.prepare", str(tmp_path), FileNotFoundError)
    _error(r"max_predictions_per_seq=5 is too small for max_seq_length=64 .* "
           r"set max_predictions_per_seq >= 10", directory, max_predictions_per_seq=5)
    _error("max_seq_length=4 is too small", directory, max_seq_length=4)
    _error("global_batch_size=15 .* process_count=2", directory, global_batch_size=15,
           process_count=2)
    _error("4 shard files for 5 hosts", directory, process_count=5,
           global_batch_size=20, process_index=1)
    _error("start_position", directory, start_position={"epoch": 0, "block": 99, "example": 0})
    _error("whole_word_masking needs Vocab.word_start", directory, whole_word_masking=True)
    _error("mask_prob=0.9 \\+ random_prob=0.2", directory, mask_prob=0.9, random_prob=0.2)
    with pytest.raises(ValueError, match="over 2 hosts needs num_batches"):
        pretraining.eval_dataset(directory, vocab=VOCAB, max_seq_length=L,
                                 max_predictions_per_seq=P, global_batch_size=8, process_count=2)

    single = str(tmp_path / "single")
    shards.write_documents(single, [[[11, 12], [13, 14]]], num_shards=1)
    _error("1 training documents .* needs at least two", single)

    long_doc = str(tmp_path / "long")
    shards.write_documents(long_doc, [[[11] * 50], [[12] * 5000]], num_shards=1)
    _error(r"documents-00000-of-00001.tfrecord: document 1 has 5,000 tokens, more than "
           "max_document_tokens=4,096", long_doc, max_document_tokens=4096)

    foreign = str(tmp_path / "foreign")
    shards.write_documents(foreign, [[[11, 12]], [[99999]]], num_shards=1)
    _error("token id 99999 outside the vocabulary", foreign)
