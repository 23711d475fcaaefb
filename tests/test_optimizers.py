"""The original BERT optimizer, schedules and the weight-decay mask, checked numerically."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.training import optimizers


def toy_params():
    return {
        "dense": {"kernel": jnp.full((2, 3), 0.5), "bias": jnp.full((3,), 0.5)},
        "layer_norm": {"scale": jnp.full((3,), 0.5), "bias": jnp.full((3,), 0.5)},
        "word_embeddings": {"embedding": jnp.full((4, 2), 0.5)},
        "mlm": {"output_bias": jnp.full((4,), 0.5)},
    }


def test_decay_mask_skips_layer_norm_and_biases():
    mask = optimizers.decay_mask(toy_params())
    assert mask == {"dense": {"kernel": True, "bias": False},
                    "layer_norm": {"scale": False, "bias": False},
                    "word_embeddings": {"embedding": True}, "mlm": {"output_bias": False}}


def test_bert_adamw_has_no_bias_correction_and_decays_only_weights():
    lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-6
    tx = optimizers.make_optimizer("bert_adamw", lambda step: lr, b1=b1, b2=b2, eps=eps,
                                   weight_decay=wd, clip_norm=None)
    params = toy_params()
    rng = np.random.default_rng(0)
    grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
             for _ in range(2)]
    state = tx.init(params)
    p = params
    for g in grads:
        updates, state = tx.update(g, state, p)
        p = optax.apply_updates(p, updates)

    # The original update, written out: m, v without bias correction; decay added to the
    # update (so scaled by lr) except for LayerNorm and bias parameters.
    mask = optimizers.decay_mask(params)
    def expected(p0, g1, g2, decays):
        p0, g1, g2 = map(np.asarray, (p0, g1, g2))
        m, v, p = np.zeros_like(p0), np.zeros_like(p0), p0.copy()
        for g in (g1, g2):
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - lr * (m / (np.sqrt(v) + eps) + (wd * p if decays else 0.0))
        return p
    want = jax.tree.map(expected, params, grads[0], grads[1], mask)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), p, want)

    # Without bias correction the first step is (1-b1)/sqrt(1-b2) ~ 3.16x the Adam step.
    first, _ = tx.update(grads[0], tx.init(params), params)
    k = np.asarray(first["layer_norm"]["scale"]) / -(lr * np.sign(grads[0]["layer_norm"]["scale"]))
    np.testing.assert_allclose(k, (1 - b1) / np.sqrt(1 - b2), rtol=1e-3)  # eps


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_weight_decay_leaves_layer_norm_and_biases_untouched(name):
    tx = optimizers.make_optimizer(name, lambda step: 0.1, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=0.01, clip_norm=1.0)
    params = toy_params()
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    for leaf in (new["dense"]["bias"], new["layer_norm"]["scale"], new["layer_norm"]["bias"],
                 new["mlm"]["output_bias"]):
        np.testing.assert_array_equal(leaf, 0.5)
    for leaf in (new["dense"]["kernel"], new["word_embeddings"]["embedding"]):
        assert np.all(np.asarray(leaf) < 0.5)
    if name == "bert_adamw":  # decay is lr * wd * p exactly
        np.testing.assert_allclose(new["dense"]["kernel"], 0.5 * (1 - 0.1 * 0.01), rtol=1e-6)


def test_global_norm_clipping():
    params = toy_params()
    g = jax.tree.map(lambda p: jnp.full(p.shape, 3.0), params)
    norm = float(optax.tree.norm(g))
    clipped = optimizers.make_optimizer("bert_adamw", lambda s: 0.1, b1=0.9, b2=0.999,
                                        eps=1e-6, weight_decay=0.0, clip_norm=1.0)
    unclipped = optimizers.make_optimizer("bert_adamw", lambda s: 0.1, b1=0.9, b2=0.999,
                                          eps=1e-6, weight_decay=0.0, clip_norm=None)
    a, _ = clipped.update(g, clipped.init(params), params)
    b, _ = unclipped.update(jax.tree.map(lambda x: x / norm, g), unclipped.init(params), params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)


def test_bert_schedule_matches_the_original():
    s = optimizers.learning_rate_schedule("bert", 1e-4, 10_000, 100_000)
    values = {step: float(s(step)) for step in (0, 5_000, 9_999, 10_000, 50_000, 100_000)}
    np.testing.assert_allclose(values[0], 0.0)
    np.testing.assert_allclose(values[5_000], 0.5e-4, rtol=1e-6)
    np.testing.assert_allclose(values[9_999], 0.9999e-4, rtol=1e-6)
    # Decay counted from step 0, as optimization.py's polynomial_decay: 90% at warmup end.
    np.testing.assert_allclose(values[10_000], 0.9e-4, rtol=1e-6)
    np.testing.assert_allclose(values[50_000], 0.5e-4, rtol=1e-6)
    assert values[100_000] == 0.0


def test_warmup_linear_schedule_peaks_at_warmup_end():
    s = optimizers.learning_rate_schedule("warmup_linear", 2e-4, 100, 1100)
    np.testing.assert_allclose([float(s(x)) for x in (0, 50, 100, 600, 1100, 2000)],
                               [0.0, 1e-4, 2e-4, 1e-4, 0.0, 0.0], atol=1e-10)


def test_bad_optimizer_settings_are_named():
    with pytest.raises(ValueError, match="optimizer.name 'sgd'"):
        optimizers.make_optimizer("sgd", lambda s: 0.1, b1=0.9, b2=0.999, eps=1e-6,
                                  weight_decay=0.0, clip_norm=None)
    with pytest.raises(ValueError, match="optimizer.schedule 'cosine'"):
        optimizers.learning_rate_schedule("cosine", 1e-4, 10, 100)
    with pytest.raises(ValueError, match=r"warmup_steps >= 0 \(got -1\)"):
        optimizers.learning_rate_schedule("bert", 1e-4, -1, 100)


def numpy_lamb(params, grads, lr, *, b1, b2, eps, weight_decay):
    """LAMB as tf-addons defines it (and NVIDIA's BERT recipe runs it), one tensor at a time:
    bias-corrected Adam, decay added to the update, then the trust ratio ||p|| / ||update||
    (1 where either norm is 0); parameters whose name matches NVIDIA's exclusion list get
    neither the decay nor the ratio."""
    excluded = ("LayerNorm", "layer_norm", "bias")
    out = {}
    for name, p in params.items():
        p = np.asarray(p, np.float64)
        m, v = np.zeros_like(p), np.zeros_like(p)
        adapt = not any(e in name for e in excluded)
        for t, g in enumerate((np.asarray(gs[name], np.float64) for gs in grads), start=1):
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            update = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            ratio = 1.0
            if adapt:
                update = update + weight_decay * p
                w_norm, u_norm = np.linalg.norm(p), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            p = p - ratio * lr(t - 1) * update
        out[name] = p
    return out


@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_lamb_matches_nvidia_lamb(weight_decay):
    rng = np.random.default_rng(1)
    normal = lambda *shape: jnp.asarray(rng.normal(0, 0.5, shape), jnp.float32)
    # Every kind of parameter BERT has, biases and LayerNorm starting as BERT's do.
    params = {
        "bert/encoder/layer_0/intermediate/kernel": normal(3, 5),
        "bert/encoder/layer_0/intermediate/bias": jnp.zeros(5),
        "bert/encoder/layer_0/attention/query/bias": normal(2, 3),
        "bert/encoder/layer_0/output_layer_norm/scale": jnp.ones(3),
        "bert/encoder/layer_0/output_layer_norm/bias": jnp.zeros(3),
        "bert/embeddings/word_embeddings/embedding": normal(7, 3),
        "mlm/output_bias": jnp.zeros(7),
        "nsp/kernel": jnp.zeros((3, 2)),  # a zero weight: ratio 1, as tf-addons
    }
    grads = [{k: normal(*p.shape) for k, p in params.items()} for _ in range(4)]
    lr = lambda step: 0.01 * (step + 1)  # a changing rate, to catch an off-by-one step
    b1, b2, eps = 0.9, 0.999, 1e-6
    tx = optimizers.make_optimizer("lamb", lr, b1=b1, b2=b2, eps=eps,
                                   weight_decay=weight_decay, clip_norm=None)
    state, p = tx.init(params), params
    for g in grads:
        updates, state = tx.update(g, state, p)
        p = optax.apply_updates(p, updates)
    want = numpy_lamb(params, grads, lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    for name in params:
        np.testing.assert_allclose(p[name], want[name], rtol=2e-5, atol=1e-7, err_msg=name)


def test_lamb_moves_a_small_bias_a_full_step():
    # The case: a bias of 0.01 with gradient 0.3 at lr 1e-3. Adam's first step is
    # lr * sign(g); a trust ratio of ||0.01|| / ||1|| would shrink it 100-fold.
    tx = optimizers.make_optimizer("lamb", lambda step: 1e-3, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=0.01, clip_norm=1.0)
    params = {"dense": {"kernel": jnp.full((4, 4), 0.01), "bias": jnp.full((4,), 0.01)}}
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.3), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["dense"]["bias"], -1e-3, rtol=1e-4)
    # The kernel keeps its ratio, which scales the step to lr * ||p|| per unit: 100x smaller.
    np.testing.assert_allclose(updates["dense"]["kernel"], -1e-5, rtol=1e-4)
