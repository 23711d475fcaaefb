"""model.dropout_rng: the cheaper generators draw masks that depend only on (seed, step,
micro-batch), so a run resumed from a checkpoint (which keeps the threefry key and the
state) continues exactly; they draw other masks than threefry; a bad name is one error."""
import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import pretrain_helpers as ph
from bertjax.models.heads import BertForPreTraining
from bertjax.training import pretrain, pretrain_config, trainer


def _setup(impl: str):
    config = ph.tiny_config()
    model = BertForPreTraining(pretrain.model_config(config.model, ph.VOCAB))
    batch = ph.synthetic_batch(0, 0, range(4), 13, 3, ph.VOCAB)
    ids = batch["input_ids"]
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, ids, ids,
                                 batch["masked_lm_positions"])["params"])
    tx = optax.adamw(1e-3)
    step = jax.jit(trainer.make_train_step(pretrain.objective(model, nsp=True), tx,
                                           lambda s: 1e-3, grad_accum_steps=2,
                                           dropout_rng=impl))
    return step, batch, trainer.TrainState(np.int32(0), params, tx.init(params))


def _two_steps(step, batch, state, resume: bool):
    rng = jax.random.PRNGKey(1)
    state, _ = step(state, batch, rng)
    if resume:  # what a checkpoint restores: host copies of the state and the key
        state, rng = jax.device_get((state, rng))
    return jax.device_get(step(state, batch, rng))


def test_cheaper_dropout_rng_resumes_exactly_and_draws_other_masks():
    step, batch, state = _setup("unsafe_rbg")
    straight_state, straight = _two_steps(step, batch, state, resume=False)
    resumed_state, resumed = _two_steps(step, batch, state, resume=True)
    assert straight == resumed
    for a, b in zip(jax.tree.leaves(straight_state), jax.tree.leaves(resumed_state)):
        np.testing.assert_array_equal(a, b)
    threefry = _two_steps(*_setup("threefry"), resume=False)[1]
    assert np.isfinite(straight["loss"]) and straight["loss"] != threefry["loss"]


def test_unknown_dropout_rng_is_one_clear_error():
    config = pretrain_config.defaults("tiny")
    config.model.dropout_rng = "philox"
    with pytest.raises(ValueError, match="model.dropout_rng 'philox': expected one of "
                                         "threefry, rbg, unsafe_rbg"):
        pretrain_config.validate(config)
