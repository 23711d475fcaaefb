"""model.scan_layers: the scanned encoder is the same function as the per-layer one, on the
same parameters (it keeps their per-layer layout, so checkpoints and conversion never see the
scan), with remat, forward and backward."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining
from test_model import ODD, _batch

PLAIN = ODD
SCANNED = dataclasses.replace(PLAIN, scan_layers=True, remat=True,
                              remat_policy="dots_with_no_batch_dims_saveable")


@pytest.mark.parametrize("sparse_last_layer", [True, False])  # the last layer apart, or not
def test_scanned_encoder_has_the_per_layer_parameters_outputs_and_gradients(sparse_last_layer):
    ids, mask, seg, pos = _batch()
    models = {scan: BertForPreTraining(dataclasses.replace(
        config, sparse_last_layer=sparse_last_layer)) for scan, config in ((False, PLAIN),
                                                                          (True, SCANNED))}
    inits = {scan: jax.eval_shape(lambda m=m: m.init(jax.random.key(0), ids, mask, seg,
                                                     pos)["params"])
             for scan, m in models.items()}
    # The same layout and logical axis names; the same values from the same key's streams
    # is not promised (the scan splits its keys per layer).
    assert (jax.tree.map(lambda x: (x.value.shape, x.names), inits[True],
                         is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
            == jax.tree.map(lambda x: (x.value.shape, x.names), inits[False],
                            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)))
    params = nn.unbox(jax.jit(models[False].init)(jax.random.key(0), ids, mask, seg,
                                                  pos)["params"])

    def loss(p, scan):
        out = models[scan].apply({"params": p}, ids, mask, seg, pos)
        return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2), out

    results = {scan: jax.jit(jax.value_and_grad(lambda p, s=scan: loss(p, s), has_aux=True))(
        params) for scan in models}
    (_, plain_out), plain_grads = results[False]
    (_, scan_out), scan_grads = results[True]
    for key in plain_out:
        np.testing.assert_allclose(scan_out[key], plain_out[key], rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(scan_grads), jax.tree.leaves(plain_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_scanned_sharded_pretraining_run_matches_the_per_layer_run(tmp_path):
    import pretrain_helpers as ph
    from bertjax.training import checkpoints, pretrain

    def config(scan):
        c = ph.tiny_config(num_steps=3)
        c.model.num_hidden_layers = 2
        c.model.hidden_dropout_prob = c.model.attention_probs_dropout_prob = 0.0
        c.model.scan_layers = scan
        c.mesh.shape = (2, 2, 2)
        return c

    # Both start from the same parameters (a fresh scanned model draws other initial values).
    start = BertConfig.from_config(config(False).model, vocab_size=ph.VOCAB)
    start_params = nn.unbox(jax.jit(BertForPreTraining(start).init)(
        jax.random.key(0), *_batch())["params"])
    checkpoints.save_model(str(tmp_path / "start"), start_params, start)
    finals = {}
    for scan in (False, True):
        c = config(scan)
        c.init_checkpoint = str(tmp_path / "start")
        workdir = str(tmp_path / f"scan{scan}")
        pretrain.train(c, workdir, ph.synthetic_data(c), jax.devices()[:8])
        # The exported model has the per-layer layout whichever way it was trained.
        finals[scan] = checkpoints.open_model(workdir).load_params()
    assert sorted(finals[True]["bert"]["encoder"]) == ["layer_0", "layer_1"]
    for a, b in zip(jax.tree.leaves(finals[True]), jax.tree.leaves(finals[False])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
