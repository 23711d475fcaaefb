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
                                   weight_decay=wd, clip_norm=0.0)
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
                                          eps=1e-6, weight_decay=0.0, clip_norm=0.0)
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
                                  weight_decay=0.0, clip_norm=0.0)
    with pytest.raises(ValueError, match="optimizer.schedule 'cosine'"):
        optimizers.learning_rate_schedule("cosine", 1e-4, 10, 100)
    with pytest.raises(ValueError, match=r"warmup_steps >= 0 \(got -1\)"):
        optimizers.learning_rate_schedule("bert", 1e-4, -1, 100)
