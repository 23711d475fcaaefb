"""The encoder and pretraining heads: shapes at odd sizes, padding, gathered MLM, presets."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import presets
from bertjax.models.bert import BertConfig, BertModel, gather_positions, tied_logits
from bertjax.models.heads import BertForPreTraining, add_output_bias

ODD = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=37, max_position_embeddings=11, type_vocab_size=2)
B, L, P = 3, 7, 2


def _batch(seed=0, lengths=(7, 5, 3)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, ODD.vocab_size, size=(B, L)).astype(np.int32)
    mask = (np.arange(L)[None] < np.array(lengths)[:, None]).astype(np.int32)
    ids = ids * mask
    segments = ((np.arange(L)[None] >= 2) & (mask == 1)).astype(np.int32)
    positions = np.stack([rng.choice(n, size=P, replace=False) for n in lengths]).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments), jnp.asarray(positions)


# Jitted, as every run applies a model: eagerly, each of its hundreds of small ops would be
# compiled on its own, seconds a test on a CPU.
def _init(model, *args):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), *args))


def _apply(model, params, *args, **kwargs):
    return jax.jit(functools.partial(model.apply, **kwargs))(params, *args)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_odd_sizes_give_expected_shapes(pre_ln):
    config = dataclasses.replace(ODD, pre_layer_norm=pre_ln)
    ids, mask, seg, pos = _batch()
    model = BertForPreTraining(config)
    params = _init(model, ids, mask, seg, pos)
    out = _apply(model, params, ids, mask, seg, pos)
    assert out["mlm_logits"].shape == (B, P, 99) and out["mlm_logits"].dtype == jnp.float32
    assert out["nsp_logits"].shape == (B, 2)
    seq, pooled = _apply(BertModel(config), {"params": params["params"]["bert"]}, ids, mask, seg)
    assert seq.shape == (B, L, 32) and pooled.shape == (B, 32)
    assert np.all(np.isfinite(seq))


def test_padding_does_not_change_outputs_at_real_positions():
    ids, mask, seg, _ = _batch(lengths=(4, 4, 4))
    model = BertModel(ODD)
    params = _init(model, ids, mask, seg)
    seq, pooled = _apply(model, params, ids, mask, seg)
    # Same real tokens, different junk in the padded positions.
    junk_ids = jnp.where(mask == 1, ids, 77)
    junk_seg = jnp.where(mask == 1, seg, 1)
    seq2, pooled2 = _apply(model, params, junk_ids, mask, junk_seg)
    np.testing.assert_allclose(seq[:, :4], seq2[:, :4], atol=1e-6)
    np.testing.assert_allclose(pooled, pooled2, atol=1e-6)
    # And a shorter sequence with no padding at all gives the same real outputs.
    seq3, _ = _apply(model, params, ids[:, :4], mask[:, :4], seg[:, :4])
    np.testing.assert_allclose(seq[:, :4], seq3, atol=1e-5)


def test_mlm_on_gathered_positions_equals_full_sequence_computation():
    ids, mask, seg, pos = _batch()
    model = BertForPreTraining(ODD)
    params = _init(model, ids, mask, seg, pos)
    gathered = _apply(model, params, ids, mask, seg, pos)["mlm_logits"]
    every = jnp.tile(jnp.arange(L)[None], (B, 1))
    full = _apply(model, params, ids, mask, seg, every)["mlm_logits"]
    np.testing.assert_allclose(gathered, gather_positions(full, pos), atol=1e-5)


def test_mlm_decoder_is_tied_to_word_embeddings():
    ids, mask, seg, pos = _batch()
    model = BertForPreTraining(ODD)
    params = _init(model, ids, mask, seg, pos)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    vocab_matrices = [jax.tree_util.keystr(p) for p, x in leaves if x.ndim == 2 and 99 in x.shape]
    assert len(vocab_matrices) == 1, vocab_matrices  # only word_embeddings, no separate decoder

    def mlm_sum(p):
        return _apply(model, p, ids, mask, seg, pos)["mlm_logits"].sum()

    grads = jax.jit(jax.grad(mlm_sum))(params)
    word_grad = grads["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    # Every vocabulary row gets decoder gradient, not only the rows of the input tokens.
    assert np.all(np.abs(np.asarray(word_grad)).sum(axis=1) > 0)


# Functions whose gradients are laid out for XLA:CPU, beside the plain expression they
# compute: (ours, plain, operand shapes).
GRADIENT_LAYOUTS = {
    # The output bias's gradient as a vector-matrix product (heads.add_output_bias).
    "output_bias": (add_output_bias, lambda x, b: x + b, ((3, 5, 99), (99,))),
    # The tied decoder's embedding gradient as (x^T g)^T (bert.tied_logits).
    "tied_decoder": (tied_logits, lambda x, e: jnp.dot(x, e.T), ((3, 5, 32), (99, 32))),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", list(GRADIENT_LAYOUTS))
def test_gradients_laid_out_for_the_cpu_are_the_plain_ones(name, dtype):
    ours, plain, shapes = GRADIENT_LAYOUTS[name]
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.normal(size=shape), dtype) for shape in shapes]
    weights = jnp.asarray(rng.normal(size=(3, 5, 99)), dtype)

    def loss(fn, *args):
        return jnp.sum(jnp.tanh(fn(*args).astype(jnp.float32) / 8) * weights)

    found = jax.grad(functools.partial(loss, ours), argnums=(0, 1))(*args)
    expected = jax.grad(functools.partial(loss, plain), argnums=(0, 1))(*args)
    assert ours(*args).dtype == dtype
    tolerance = 1e-5 if dtype == jnp.float32 else 3e-2
    for a, b in zip(found, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tolerance, atol=tolerance)


def test_dropout_is_active_only_when_not_deterministic():
    ids, mask, seg, pos = _batch()
    model = BertForPreTraining(ODD)
    params = _init(model, ids, mask, seg, pos)
    det = _apply(model, params, ids, mask, seg, pos)["mlm_logits"]
    dropped = jax.jit(lambda key: model.apply(params, ids, mask, seg, pos, deterministic=False,
                                              rngs={"dropout": key})["mlm_logits"])
    run = lambda k: dropped(jax.random.key(k))
    assert not np.allclose(det, run(1))
    np.testing.assert_array_equal(run(1), run(1))
    assert not np.allclose(run(1), run(2))


def test_remat_and_bfloat16_compute_keep_the_function():
    ids, mask, seg, pos = _batch()
    params = _init(BertForPreTraining(ODD), ids, mask, seg, pos)
    base = _apply(BertForPreTraining(ODD), params, ids, mask, seg, pos)["mlm_logits"]
    remat = _apply(BertForPreTraining(dataclasses.replace(ODD, remat=True)),
                   params, ids, mask, seg, pos)["mlm_logits"]
    np.testing.assert_allclose(base, remat, atol=1e-6)
    bf16 = _apply(BertForPreTraining(dataclasses.replace(ODD, dtype=jnp.bfloat16)),
                  params, ids, mask, seg, pos)["mlm_logits"]
    assert bf16.dtype == jnp.float32  # logits come back in float32 for the loss
    np.testing.assert_allclose(base, bf16, atol=0.1)


def test_every_parameter_has_logical_axis_names():
    ids, mask, seg, pos = _batch()
    boxed = jax.jit(BertForPreTraining(ODD).init)(jax.random.key(0), ids, mask, seg, pos)
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
    assert all(len(x.names) == x.value.ndim for x in leaves)
    used = {n for x in leaves for n in x.names if n}
    assert used == {"vocab", "embed", "heads", "kv", "mlp"}


def _count(config):
    ids = jnp.zeros((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: nn.unbox(BertModel(config).init(
        jax.random.key(0), ids, ids, ids)))  # abstract: nothing is allocated
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))


def test_base_preset_counts_110m_parameters():
    n = _count(presets.preset("base"))
    assert 109_000_000 < n < 110_500_000, n  # BERT-base: "110M"
    assert 334_000_000 < _count(presets.preset("large")) < 336_000_000


@pytest.mark.parametrize("name,layers,hidden", [("tiny", 2, 128), ("mini", 4, 256),
                                                ("small", 4, 512), ("medium", 8, 512)])
def test_presets_follow_the_bert_shape_rules(name, layers, hidden):
    c = presets.preset(name)
    assert (c.num_hidden_layers, c.hidden_size) == (layers, hidden)
    assert c.num_attention_heads == hidden // 64 and c.intermediate_size == 4 * hidden


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        presets.preset("huge")
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        BertConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="swishy")
    ids, mask, seg, _ = _batch()
    model = BertModel(dataclasses.replace(ODD, max_position_embeddings=5))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 5"):
        model.init(jax.random.key(0), ids, mask, seg)


def test_gelu_names_mean_their_formulas():
    """'gelu' is the exact erf form (BERT's first release, Hugging Face's 'gelu'); 'gelu_tanh'
    and 'gelu_new' the tanh approximation of google-research/bert's current modeling.py. A
    checkpoint converted under the wrong name would be off by up to 4.7e-4 per activation."""
    import math

    from bertjax.models.bert import ACTIVATIONS
    x = np.linspace(-5, 5, 201)
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(ACTIVATIONS["gelu"](jnp.asarray(x, jnp.float32)), exact,
                               atol=2e-6)
    for name in ("gelu_tanh", "gelu_new"):
        np.testing.assert_allclose(ACTIVATIONS[name](jnp.asarray(x, jnp.float32)), tanh,
                                   atol=2e-6)
    assert np.abs(exact - tanh).max() > 4e-4
