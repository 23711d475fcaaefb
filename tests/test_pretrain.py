"""The pretraining loop on synthetic data: accumulation is exact, it stops on divergence
without saving a diverged state, and checkpoints from other sizes fail clearly. (Learning,
preemption and resume on real text: test_pretrain_austen.py.)"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pretrain_helpers as ph
from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining
from bertjax.training import checkpoints, pretrain, trainer


def records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(workdir):
    return [(r["step"], r["loss"]) for r in records(workdir) if "loss" in r]


def test_gradient_accumulation_4x8_equals_batch_of_32(tmp_path):
    results = {}
    for accum in (1, 4):
        config = ph.tiny_config(num_steps=3, global_batch_size=32)
        config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
        config.optimizer.grad_accum_steps = accum
        out = pretrain.train(config, str(tmp_path / f"a{accum}"), ph.synthetic_data(config))
        results[accum] = (records(tmp_path / f"a{accum}"), jax.device_get(out["state"].params))
    (logs1, params1), (logs4, params4) = results[1], results[4]
    for r1, r4 in zip(logs1, logs4):
        for key in ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
            np.testing.assert_allclose(r4[key], r1[key], rtol=1e-5, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), params4, params1)


class PoisonedData:
    """Synthetic data whose masked_lm_weights become NaN from step `bad_step` on."""

    def __init__(self, config, bad_step):
        self.inner = ph.synthetic_data(config)
        self.bad_step = bad_step
        self.vocab_size, self.eval, self.tokenizer = ph.VOCAB, None, None

    def train(self, position):
        it = self.inner.train(position)
        bad_step = self.bad_step

        class Poisoned:
            def __next__(self):
                batch = next(it)
                if it.step >= bad_step:
                    batch["masked_lm_weights"] = batch["masked_lm_weights"] * np.nan
                return batch

            def position(self):
                return it.position()
        return Poisoned()


def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    config = ph.tiny_config(checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"loss nan, grad_norm nan at step 5; stopped "
                       r"without saving \(the last good checkpoint is step 4 in .*checkpoints"):
        pretrain.train(config, str(tmp_path), PoisonedData(config, bad_step=5))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
    assert [s for s, _ in train_losses(tmp_path)] == [1, 2, 3, 4]


def test_checkpoints_of_another_model_size_fail_clearly(tmp_path):
    config = ph.tiny_config()
    out = pretrain.train(config, str(tmp_path / "run"), ph.synthetic_data(config))

    bigger = ph.tiny_config()
    bigger.model.hidden_size = 40
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoints/6 does not match the model "
                       r"\(another model size or architecture\?\).*\(36,\), model \(40,\)"):
        pretrain.train(bigger, str(tmp_path / "run"), ph.synthetic_data(bigger))
    bigger.init_checkpoint = str(tmp_path / "run")
    with pytest.raises(ValueError, match="run/checkpoints/6/params does not match the model"):
        pretrain.train(bigger, str(tmp_path / "bigger"), ph.synthetic_data(bigger))
    bigger.init_checkpoint = str(tmp_path / "run" / "model")
    with pytest.raises(ValueError, match="params does not match the model"):
        pretrain.train(bigger, str(tmp_path / "bigger"), ph.synthetic_data(bigger))

    # Same size: the run's latest parameters come back exactly (continued pretraining).
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            out["state"].params)
    for source in ("run", "run/model"):
        loaded = checkpoints.open_model(str(tmp_path / source)).load_params(abstract)
        jax.tree.map(np.testing.assert_array_equal, loaded, out["state"].params)
    # ... and a run started from them has a fresh step count and schedule but trained weights.
    config.init_checkpoint = str(tmp_path / "run")
    pretrain.train(config, str(tmp_path / "continued"), ph.synthetic_data(config))
    first, continued = records(tmp_path / "run")[0], records(tmp_path / "continued")[0]
    assert continued["step"] == 1 and continued["learning_rate"] == 0.0
    assert continued["loss"] < first["loss"] - 0.05, (continued, first)


def test_bfloat16_compute_keeps_float32_parameters_and_losses():
    config = ph.tiny_config()
    config.model.dtype = "bfloat16"
    model = BertForPreTraining(BertConfig.from_config(config.model, vocab_size=ph.VOCAB))
    batch = ph.synthetic_batch(0, 0, range(4), 13, 3, ph.VOCAB)
    ids = batch["input_ids"]
    params = nn.unbox(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), ids, ids, ids, batch["masked_lm_positions"]))
        ["params"])
    tx = optax.adamw(1e-3)
    state = trainer.TrainState(jax.ShapeDtypeStruct((), jnp.int32), params,
                               jax.eval_shape(tx.init, params))
    step = trainer.make_train_step(pretrain.objective(model, nsp=True), tx, lambda s: 1e-3,
                                   grad_accum_steps=1)
    new_state, metrics = jax.eval_shape(step, state, batch, jax.random.PRNGKey(1))
    assert {x.dtype for x in jax.tree.leaves(new_state.params)} == {jnp.dtype("float32")}
    assert {x.dtype for x in jax.tree.leaves(new_state.opt_state)} <= {
        jnp.dtype("float32"), jnp.dtype("int32")}
    assert {x.dtype for x in metrics.values()} == {jnp.dtype("float32")}
    # The matmuls themselves run in bfloat16.
    jaxpr = str(jax.make_jaxpr(step)(state, batch, jax.random.PRNGKey(1)))
    assert "dot_general" in jaxpr and "preferred_element_type=bfloat16" in jaxpr
