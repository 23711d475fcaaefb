"""Packed pretraining rows (data.examples_per_row > 1): a block's packed rows hold exactly the
examples its unpacked rows hold, each with its own positions, predictions and next-sentence
label; short documents fill the rows; and the model gives every packed example the loss and
the gradient it has alone in a padded row."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf

from bertjax.data import pretraining, shards
from bertjax.data.examples import Recipe
from bertjax.models.bert import BertConfig, Packing
from bertjax.models.heads import BertForPreTraining
from bertjax.training import metrics

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = pretraining.Vocab(size=99, pad_id=PAD, unk_id=UNK, cls_id=CLS, sep_id=SEP,
                          mask_id=MASK)
L, P, K = 64, 10, 4


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory):
    """Documents of a few short sentences: most examples are far shorter than a row."""
    rng = np.random.default_rng(0)
    docs = [[list(rng.integers(5, 99, size=rng.integers(2, 9))) for _ in range(rng.integers(1, 5))]
            for _ in range(300)]
    directory = str(tmp_path_factory.mktemp("short"))
    shards.write_documents(directory, docs, num_shards=2)
    return directory


def _block(directory, examples_per_row):
    """Every row of the first block of epoch 0."""
    recipe = Recipe(L, P, examples_per_row=examples_per_row)
    pool = pretraining._load(directory, recipe, VOCAB, process_index=0, process_count=1,
                             heldout_fraction=0.0, heldout=False, max_document_tokens=10_000)
    pipeline = pretraining._Pipeline(pool, recipe, VOCAB, seed=5, process_index=0,
                                     shuffle_tokens=1 << 12)
    block = next(iter(pipeline.blocks(tf.data.Dataset.range(1))))
    seed, host, _ = pipeline._keys
    rows = pipeline._make(*block, tf.constant(0, tf.int64), seed, host, *pipeline._pool)
    return {k: v.numpy() for k, v in rows.items() if not k.startswith("_")}


def _examples(rows, packed):
    """Each example as (tokens, segments, predictions as (position in it, id, weight), NSP
    label), from padded or packed rows."""
    out = []
    for r in range(len(rows["input_ids"])):
        slots = range(K) if packed else [None]
        for k in slots:
            if packed:
                at = np.flatnonzero(rows["example_ids"][r] == k + 1)
                if not len(at):
                    assert rows["example_weights"][r, k] == 0
                    continue
                assert rows["example_weights"][r, k] == 1
                assert rows["cls_positions"][r, k] == at[0]
                assert list(rows["position_ids"][r, at]) == list(range(len(at)))
                label = rows["next_sentence_labels"][r, k]
            else:
                at = np.flatnonzero(rows["input_mask"][r])
                label = rows["next_sentence_labels"][r]
            predictions = tuple((int(p - at[0]), int(i)) for p, i, w in zip(
                rows["masked_lm_positions"][r], rows["masked_lm_ids"][r],
                rows["masked_lm_weights"][r]) if w > 0 and p in at)
            out.append((tuple(rows["input_ids"][r, at]), tuple(rows["segment_ids"][r, at]),
                        predictions, int(label)))
    return out


def test_packed_rows_hold_the_same_examples_and_fill_the_rows(short_documents):
    padded, packed = _block(short_documents, 1), _block(short_documents, K)
    assert sorted(_examples(padded, False)) == sorted(_examples(packed, True))
    real = lambda rows: rows["input_mask"].sum() / rows["input_mask"].size  # noqa: E731
    print(f"real tokens per row: padded {real(padded):.3f}, packed {real(packed):.3f}, "
          f"rows {len(padded['input_ids'])} -> {len(packed['input_ids'])}")
    assert real(packed) >= 0.9 and real(packed) >= 2.5 * real(padded)
    assert packed["masked_lm_positions"].shape[1] == P + K
    assert all(p > 0 for ex in _examples(packed, True) for p, _ in ex[2])  # never a [CLS]


@functools.partial(jax.jit, static_argnums=(1, 3))
def _per_example_losses(params, model, rows, packed):
    out = model.apply({"params": params}, rows["input_ids"], rows["input_mask"],
                      rows["segment_ids"], rows["masked_lm_positions"],
                      packing=Packing.from_batch(rows) if packed else None)
    mlm = optax.softmax_cross_entropy_with_integer_labels(out["mlm_logits"],
                                                          rows["masked_lm_ids"])
    mlm = mlm * rows["masked_lm_weights"]
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out["nsp_logits"], rows["next_sentence_labels"].astype(jnp.int32))
    if packed:
        # Each prediction belongs to the example whose token it is.
        owner = jnp.take_along_axis(rows["example_ids"], rows["masked_lm_positions"], 1) - 1
        mlm = jnp.sum(mlm[:, :, None] * (owner[:, :, None] == jnp.arange(K)), axis=1)
        nsp = nsp * rows["example_weights"]
        return mlm, nsp
    return mlm.sum(-1), nsp


def test_packed_batch_gives_each_example_its_padded_loss_and_gradient(short_documents):
    padded, packed = _block(short_documents, 1), _block(short_documents, K)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=L)
    model = BertForPreTraining(config)
    # Jitted: eagerly, each of the initialisers' hundreds of small ops is compiled on its own.
    params = jax.jit(model.init)(jax.random.PRNGKey(0), padded["input_ids"][:1],
                                 padded["input_mask"][:1], padded["segment_ids"][:1],
                                 padded["masked_lm_positions"][:1])["params"]

    # Per example, matched by content (identical examples have identical losses).
    mlm_p, nsp_p = _per_example_losses(params, model, padded, False)
    mlm_k, nsp_k = _per_example_losses(params, model, packed, True)
    filled = np.argwhere(packed["example_weights"] > 0)  # (row, slot), row-major
    alone = sorted(zip(_examples(padded, False), np.asarray(mlm_p), np.asarray(nsp_p)),
                   key=lambda x: x[0])
    together = sorted(zip(_examples(packed, True), np.asarray(mlm_k)[tuple(filled.T)],
                          np.asarray(nsp_k)[tuple(filled.T)]), key=lambda x: x[0])
    assert [a[0] for a in alone] == [t[0] for t in together]
    np.testing.assert_allclose([t[1:] for t in together], [a[1:] for a in alone],
                               rtol=1e-4, atol=1e-5)

    def total(p, rows, packed_rows):
        mlm, nsp = _per_example_losses(p, model, rows, packed_rows)
        return jnp.sum(mlm) + jnp.sum(nsp)

    gradient = jax.jit(jax.grad(total), static_argnums=2)
    g_padded, g_packed = gradient(params, padded, False), gradient(params, packed, True)
    for a, b in zip(jax.tree_util.tree_leaves(g_padded), jax.tree_util.tree_leaves(g_packed)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_a_packed_stream_resumes_at_the_next_row(short_documents):
    def stream(**kw):
        return pretraining.pretraining_dataset(
            short_documents, vocab=VOCAB, max_seq_length=L, max_predictions_per_seq=P,
            global_batch_size=8, seed=5, shuffle_tokens=1 << 12, examples_per_row=K, **kw)

    whole = stream()
    batches = [next(whole) for _ in range(40)]  # more than an epoch's rows
    resumed = stream()
    for _ in range(17):
        next(resumed)
    again = stream(start_position=resumed.position())
    for expected in batches[17:]:
        got = next(again)
        assert set(got) == set(expected)
        for k in expected:
            np.testing.assert_array_equal(got[k], expected[k], err_msg=k)


def test_the_progress_line_counts_packed_examples_not_rows(short_documents, tmp_path, monkeypatch):
    packed = _block(short_documents, K)
    rows, examples = len(packed["input_ids"]), int(packed["example_weights"].sum())
    assert packed["example_ids"].max(1).sum() == examples  # ids 1..k in each row
    assert examples > 2 * rows

    clock = iter(float(t) for t in range(100))  # one step a second
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    log = metrics.TrainingLog(str(tmp_path), total_steps=4, log_every=4, seq_per_step=rows,
                              flops_per_step=1.0, peak_flops=1.0, quiet=True, window=[])
    log.restart_clock(0)
    for step in range(1, 5):
        log.record(step, {"loss": 1.0, "grad_norm": 1.0, "learning_rate": 1e-3,
                          "examples": examples}, "unused")
    log.close()
    (record,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert record["seq_per_sec"] == pytest.approx(examples)
    assert "examples" not in record  # the log records stay what they were
