"""Meshes, rules and sharded training: same losses on every mesh, parameters sharded as the
rules say, and clear errors for meshes and dimensions that do not fit."""

import json
import os

import flax.linen as nn
import jax
import jax.extend
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pretrain_helpers as ph
from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining
from bertjax.training import config_sections, pretrain, sharding
from bertjax.training.trainer import Steps


def test_mesh_shape_fills_and_checks_the_device_count():
    assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
    assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"mesh.shape \(3, 1, 1\) needs 3 devices, but there are 8"):
        sharding.resolve_mesh_shape((3, 1, 1), 8)
    with pytest.raises(ValueError, match=r"fixed axes \(3 devices\) do not divide the 8"):
        sharding.resolve_mesh_shape((-1, 3, 1), 8)
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.resolve_mesh_shape((-1, -1, 1), 8)
    with pytest.raises(ValueError, match="expected 3 sizes"):
        sharding.resolve_mesh_shape((8, 1), 8)


def test_indivisible_parameter_dimension_names_parameter_and_axis():
    config = BertConfig(vocab_size=104, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=40)
    model = BertForPreTraining(config)
    ids = jax.numpy.zeros((1, 7), jax.numpy.int32)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, ids, ids, ids[:, :3]))
    mesh = sharding.make_mesh((1, 1, 8))
    with pytest.raises(ValueError, match=r"parameter bert/encoder/layer_0/attention/"
                       r"attention_output/kernel \(4, 8, 32\): dimension 0 \(logical axis "
                       r"'heads', size 4\) is not divisible by mesh axis 'tensor' of size 8"):
        sharding.param_shardings(boxed["params"], mesh, config_sections.DEFAULT_RULES)
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        sharding.param_shardings(boxed["params"], mesh, (("embed", "model"),))


def test_batch_must_split_over_batch_shards():
    mesh = sharding.make_mesh((2, 4, 1))
    with pytest.raises(ValueError, match=r"global_batch_size 12 is not divisible by "
                       r"grad_accum_steps \(1\) x batch shards \(8"):
        sharding.check_batch_size(12, mesh, config_sections.DEFAULT_RULES)


def _losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def test_every_mesh_gives_the_same_losses_and_shards_as_the_rules_say(tmp_path):
    losses, states = {}, {}
    for shape, devices in [((8, 1, 1), None), ((2, 4, 1), None), ((2, 2, 2), None),
                           ((1, 1, 1), jax.devices()[:1])]:
        config = ph.tiny_config()
        config.mesh.shape = shape
        workdir = str(tmp_path / "x".join(map(str, shape)))
        out = pretrain.train(config, workdir, ph.synthetic_data(config), devices=devices)
        losses[shape], states[shape] = _losses(workdir), out["state"]
    assert len(losses[(8, 1, 1)]) == 6
    for shape, values in losses.items():
        # Float32; only the order of reductions differs between meshes.
        np.testing.assert_allclose(values, losses[(1, 1, 1)], rtol=2e-6, err_msg=str(shape))

    params = states[(2, 2, 2)].params
    embedding = params["bert"]["embeddings"]["word_embeddings"]["embedding"]  # [vocab, embed]
    assert embedding.sharding.spec == P("tensor", "fsdp")
    assert embedding.addressable_shards[0].data.shape == (106 // 2, 36 // 2)
    query = params["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]  # [D, H, K]
    assert query.sharding.spec == P("fsdp", "tensor", None)
    assert query.addressable_shards[0].data.shape == (18, 1, 18)
    mlp = params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]  # [embed, mlp]
    assert mlp.sharding.spec == P("fsdp", "tensor")
    # Adam moments are sharded like the parameters they belong to.
    mu = states[(2, 2, 2)].opt_state[1][0].mu["bert"]["embeddings"]["word_embeddings"]
    assert mu["embedding"].sharding.spec == P("tensor", "fsdp")
    fsdp_kernel = states[(2, 4, 1)].params["bert"]["encoder"]["layer_0"]["output"]["kernel"]
    assert fsdp_kernel.sharding.spec == P("tensor", "fsdp")  # [mlp, embed]
    assert fsdp_kernel.addressable_shards[0].data.shape == (38, 36 // 4)


def _constraint_specs(jaxpr) -> list:
    """The partition specs of every sharding constraint in a traced program, nested ones
    included."""
    specs = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "sharding_constraint":
            specs.append(eqn.params["sharding"].spec)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            specs += _constraint_specs(sub)
    return specs


def test_the_masked_lm_head_is_constrained_on_the_mesh_its_arrays_are_on():
    """Without the MLM head's batch-sharded constraint XLA's partitioner computes wrong
    gradients on meshes with data, fsdp and tensor all > 1. No module is given the mesh: the
    head finds it in the step's arrays."""
    config = ph.tiny_config()
    config.mesh.shape = (2, 2, 2)
    mesh = sharding.make_mesh(config.mesh.shape)
    cfg = BertConfig.from_config(config.model, vocab_size=ph.VOCAB)
    steps = Steps(**pretrain.steps_args(config, cfg, mesh))
    with nn.logical_axis_rules(steps.rules):
        traced = steps.jitted_train_step.trace(
            steps.abstract_state(), steps.abstract_batch(pretrain.batch_spec(config)),
            steps.abstract_rng())
    rows = P(("data", "fsdp"), None, None)
    # The forward pass's constraint and its transpose in the backward pass.
    assert _constraint_specs(traced.jaxpr.jaxpr).count(rows) >= 2
