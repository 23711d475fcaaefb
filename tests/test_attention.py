"""model.attention='splash': TPU's splash-attention kernel (run by Pallas's interpreter on
CPUs) gives XLA's attention outputs and gradients, with padding (a row of padding only
included), packed rows and the sparse last layer's gathered queries, on a mesh that splits
rows and heads; and a config asking for dropout on its probabilities is one clear error."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.models import attention
from bertjax.models.bert import BertConfig, BertModel, Packing
from bertjax.models.heads import BertForPreTraining
from bertjax.training import config_sections, finetune_config, pretrain_config, sharding

# The kernel's blocks are 128 positions: the shortest length it runs at.
L = 128
SMALL = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=48, max_position_embeddings=L,
                   attention_probs_dropout_prob=0.0)
LENGTHS = (128, 100, 37, 0)  # the last row is padding only (a batch's filler)
# Packed rows: examples 1, 2, ... then padding (0).
EXAMPLES = ((60, 68), (50, 40, 20), (128,), (30,))


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, SMALL.vocab_size, size=(len(LENGTHS), L)).astype(np.int32)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    example_ids = np.zeros_like(ids)
    for row, sizes in enumerate(EXAMPLES):
        example_ids[row, :sum(sizes)] = np.repeat(np.arange(1, len(sizes) + 1), sizes)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": (np.arange(L)[None] >= 20) * mask,
            "example_ids": example_ids}


def _sharded(config, packed: bool):
    """Outputs and gradients of a pretraining model (sparse last layer: the [CLS]s and 3 read
    positions per row) jitted on a (data 2, fsdp 2, tensor 2) mesh: rows over data x fsdp,
    heads over tensor, as training shards them. The loss reads only rows with real tokens
    (and, packed, only real tokens)."""
    mesh = sharding.make_mesh((2, 2, 2))
    rules = config_sections.DEFAULT_RULES
    batch = _batch()
    model = BertForPreTraining(config)
    reads = np.array([[5, 90, 127], [1, 60, 99], [3, 17, 36], [0, 0, 0]], np.int32)
    kwargs = {}
    if packed:
        batch["input_mask"] = (batch["example_ids"] > 0).astype(np.int32)
        firsts = [np.cumsum((0,) + sizes[:-1]) for sizes in EXAMPLES]
        positions = np.zeros_like(batch["example_ids"])
        for row, sizes in enumerate(EXAMPLES):
            positions[row, :sum(sizes)] = np.concatenate([np.arange(n) for n in sizes])
        kwargs["packing"] = Packing(positions, batch["example_ids"],
                                    np.array([[*f, *f][:2] for f in firsts], np.int32))
        reads = np.array([[5, 70, 127], [1, 60, 105], [3, 17, 36], [0, 10, 29]], np.int32)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"], reads)
    boxed = jax.eval_shape(model.init, jax.random.key(0), *args, **kwargs)["params"]
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    rows = sharding.batch_sharding(mesh, rules)
    with nn.logical_axis_rules(rules):
        params = jax.jit(lambda k: nn.unbox(model.init(k, *args, **kwargs)["params"]),
                         out_shardings=param_sh)(jax.random.key(0))
    # Every row but the last (padding only); packed, every row's examples.
    weight = np.array([1, 1, 1, int(packed)], np.float32)

    def loss(p, args, kwargs):
        out = model.apply({"params": p}, *args, **kwargs)
        return sum(jnp.sum(jnp.sin(x) * weight.reshape(-1, *[1] * (x.ndim - 1)))
                   for x in jax.tree.leaves(out)), out

    # Placed on the mesh, as the trainer's batches are: the kernel finds the mesh in them.
    args, kwargs = jax.device_put((args, kwargs), rows)
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    with nn.logical_axis_rules(rules):
        (_, out), grads = step(params, args, kwargs)
        traced = step.trace(params, args, kwargs).jaxpr
    return out, grads, weight, _shard_map_specs(traced.jaxpr)


def _shard_map_specs(jaxpr) -> list:
    """The in_specs of every shard_map in a traced program, nested ones included."""
    specs = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            specs.append(eqn.params["in_specs"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            specs += _shard_map_specs(sub)
    return specs


@pytest.mark.parametrize("packed", [False, True], ids=["padding", "packed_scanned_remat"])
def test_splash_gives_xla_outputs_and_gradients(packed):
    # Packed rows also with the layers scanned and recomputed in the backward pass: the
    # segment ids go through nn.scan and nn.remat as the boolean masks do.
    config = dataclasses.replace(SMALL, scan_layers=packed, remat=packed)
    out_xla, grads_xla, weight, _ = _sharded(config, packed)
    out_splash, grads_splash, _, specs = _sharded(
        dataclasses.replace(config, attention="splash"), packed)
    # The kernel per device on its rows and heads, forward and backward (the first layer;
    # the sparse last layer's gathered queries run XLA's attention). Scanned, JAX also
    # splits off shard_maps of the segment ids alone.
    rows_heads = P(("data", "fsdp"), "tensor", None, None)
    assert sum(rows_heads in spec for spec in specs) >= 2, specs
    kept = weight > 0
    for x, y in zip(jax.tree.leaves(out_splash), jax.tree.leaves(out_xla), strict=True):
        np.testing.assert_allclose(np.asarray(x)[kept], np.asarray(y)[kept], rtol=1e-5,
                                   atol=1e-5)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(grads_splash),
                            jax.tree.leaves(grads_xla), strict=True):
        # Relative to the leaf's size, with a floor: the key bias's gradient is zero but for
        # rounding (a softmax ignores a shift of every score).
        scale = max(float(np.abs(y).max()), 1e-3)
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))


def test_splash_gives_every_position_of_the_padded_rows():
    """Padding positions too (the SQuAD head's softmax reads them): they attend to the real
    tokens, as under XLA's padding mask."""
    batch = _batch()
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
    params = jax.jit(BertModel(SMALL).init)(jax.random.key(1), *args)
    xla, splash = (jax.jit(BertModel(dataclasses.replace(SMALL, attention=a)).apply)(
        params, *args)[0] for a in ("xla", "splash"))
    np.testing.assert_allclose(splash[:3], xla[:3], rtol=1e-5, atol=1e-5)
    assert np.isfinite(splash[3]).all()


@pytest.mark.parametrize("packed", [False, True], ids=["padding", "packed"])
def test_splash_gradients_are_those_of_its_outputs_in_every_row(packed):
    """Its gradients are those of the attention it computes, in every row and at every
    position: the kernel's backward pass is wrong for a query that sees no key, and the
    segment ids never leave one so (a row of padding only sees its own positions). Without a
    mesh, on the whole batch."""
    batch = _batch()
    segments = (attention.packed_segments(batch["example_ids"]) if packed
                else attention.padding_segments(batch["input_mask"]))
    rng = np.random.default_rng(1)
    q, k, v, w = (jnp.asarray(rng.normal(size=(len(LENGTHS), L, 2, 64)), jnp.float32)
                  for _ in range(4))

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * w)

    splash = jax.jit(jax.value_and_grad(functools.partial(
        loss, lambda q, k, v: attention.splash_attention(q, k, v, segments)), (0, 1, 2)))
    xla = jax.jit(jax.value_and_grad(functools.partial(
        loss, lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=segments.dense())),
        (0, 1, 2)))
    for x, y in zip(jax.tree.leaves(splash(q, k, v)), jax.tree.leaves(xla(q, k, v)),
                    strict=True):  # the loss (a sum of 65,536 terms), then the gradients
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_splash_with_dropout_on_the_probabilities_is_an_error():
    with pytest.raises(ValueError, match="attention_probs_dropout_prob to 0, not 0.1"):
        dataclasses.replace(SMALL, attention="splash", attention_probs_dropout_prob=0.1)
    with pytest.raises(ValueError, match="attention 'flash': expected one of"):
        dataclasses.replace(SMALL, attention="flash")
    for config in (pretrain_config.defaults("tiny"), finetune_config.defaults()):
        config.model.attention = "splash"  # attention_probs_dropout_prob stays 0.1
        with pytest.raises(ValueError, match=r"model.attention 'splash' .* set "
                                             r"attention_probs_dropout_prob to 0, not 0.1"):
            config_sections.check_model(config.model)
        config.model.attention = "flash"
        with pytest.raises(ValueError, match="model.attention 'flash': expected one of"):
            config_sections.check_model(config.model)


def test_the_config_key_reaches_the_model():
    pretraining = pretrain_config.defaults("tiny")
    finetuning = finetune_config.defaults()
    for config in (pretraining, finetuning):
        config.model.attention = "splash"
        config.model.attention_probs_dropout_prob = 0.0
    assert BertConfig.from_config(pretraining.model, vocab_size=100).attention == "splash"
    assert BertConfig.from_config(finetuning.model, BertConfig()).attention == "splash"


def test_validate_checks_the_attention():
    config = pretrain_config.defaults("tiny")
    config.model.attention = "splash"
    with pytest.raises(ValueError, match="model.attention 'splash' .* set "
                                         "attention_probs_dropout_prob to 0"):
        pretrain_config.validate(config)
    config.model.attention_probs_dropout_prob = 0.0
    pretrain_config.validate(config)
