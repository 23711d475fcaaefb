"""model.sparse_last_layer: the last layer computes only the positions the heads read, and
every head gives the outputs and gradients of the full last layer (pre- and post-LN, scanned,
packed rows, the one-stack seq2seq mask), from the same parameters."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.bert import Packing
from bertjax.models.heads import BertForPreTraining, BertForSequenceClassification
from bertjax.models.seq2seq import UniLM
from bertjax.training import metrics
from test_model import ODD, _batch, _init

# Two sequences packed in each row: example 1 at 0-3, example 2 at 4-6 (row 1 pads position 6).
EXAMPLE_IDS = jnp.array([[1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2]])
CLS_POSITIONS = jnp.array([[0, 4], [0, 3], [0, 5]])


def _position_ids(example_ids):
    """Positions restarting at each example's first token."""
    rows = []
    for row in np.asarray(example_ids):
        first = {}
        rows.append([p - first.setdefault(e, p) for p, e in enumerate(row)])
    return jnp.array(rows)


PACKING = Packing(_position_ids(EXAMPLE_IDS), EXAMPLE_IDS, CLS_POSITIONS)


def _outputs_and_grads(model_cls, config, params, args, kwargs, rng=None):
    model = model_cls(config)

    # The key is an argument, not a constant, so two keys give one program: the second
    # compilation is a hit in the tests' persistent compilation cache.
    def loss(p, key):
        out = model.apply({"params": p}, *args, deterministic=key is None,
                          rngs=None if key is None else {"dropout": key}, **kwargs)
        return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(out)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, rng)
    return out, grads


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("variant", ["post_ln", "pre_ln", "scanned_remat", "packed"])
def test_pretraining_heads_equal_the_full_last_layer(variant):
    config = dataclasses.replace(
        ODD, pre_layer_norm=variant == "pre_ln", scan_layers=variant == "scanned_remat",
        remat=variant == "scanned_remat")
    ids, mask, seg, pos = _batch()
    kwargs = {}
    if variant == "packed":  # the packed mask's rows are gathered per read position
        kwargs = {"packing": PACKING}
        mask = (EXAMPLE_IDS > 0).astype(jnp.int32)
    full = dataclasses.replace(config, sparse_last_layer=False)
    sparse = dataclasses.replace(config, sparse_last_layer=True)
    params = _init(BertForPreTraining(full), ids, mask, seg, pos)["params"]
    # One parameter layout: checkpoints move between the two.
    sparse_init = jax.eval_shape(BertForPreTraining(sparse).init, jax.random.key(0), ids, mask,
                                 seg, pos)
    assert jax.tree.structure(nn.unbox(sparse_init)) == jax.tree.structure({"params": params})
    args = (ids, mask, seg, pos)
    out_full, grads_full = _outputs_and_grads(BertForPreTraining, full, params, args, kwargs)
    out_sparse, grads_sparse = _outputs_and_grads(BertForPreTraining, sparse, params, args,
                                                  kwargs)
    assert out_sparse["mlm_logits"].shape == (3, 2, ODD.vocab_size)
    if variant == "packed":
        assert out_sparse["nsp_logits"].shape == (3, 2, 2)
    _assert_same(out_sparse, out_full)
    _assert_same(grads_sparse, grads_full)
    # Training still drops out in the last layer: another key, other outputs.
    with_dropout = [_outputs_and_grads(BertForPreTraining, sparse, params, args, kwargs,
                                       jax.random.key(k))[0]["mlm_logits"] for k in (1, 2)]
    assert not np.allclose(with_dropout[0], out_sparse["mlm_logits"], atol=1e-3)
    assert not np.allclose(with_dropout[0], with_dropout[1], atol=1e-3)


@pytest.mark.parametrize("packed", [False, True])
def test_classification_reads_only_the_cls_and_equals_the_full_last_layer(packed):
    ids, mask, seg, _ = _batch()
    kwargs = {}
    if packed:
        kwargs = {"packing": PACKING}
        mask = (EXAMPLE_IDS > 0).astype(jnp.int32)
    full = dataclasses.replace(ODD, sparse_last_layer=False)
    sparse = dataclasses.replace(ODD, sparse_last_layer=True)
    params = _init(BertForSequenceClassification(full, 3), ids, mask, seg)["params"]

    def run(config):
        return _outputs_and_grads(lambda c: BertForSequenceClassification(c, 3), config,
                                  params, (ids, mask, seg), kwargs)

    (out_full, grads_full), (out_sparse, grads_sparse) = run(full), run(sparse)
    assert out_sparse.shape == ((3, 2, 3) if packed else (3, 3))
    _assert_same(out_sparse, out_full)
    _assert_same(grads_sparse, grads_full)


def test_one_stack_seq2seq_mask_rows_are_read_at_the_masked_positions():
    ids, mask, _, pos = _batch()
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0]])
    pos = jnp.array([[4, 6], [3, 4], [1, 2]])  # target positions, which see only the past
    full = dataclasses.replace(ODD, sparse_last_layer=False)
    sparse = dataclasses.replace(ODD, sparse_last_layer=True)
    params = _init(UniLM(full), ids, mask, seg, pos)["params"]
    out_full, grads_full = _outputs_and_grads(UniLM, full, params, (ids, mask, seg, pos), {})
    out_sparse, grads_sparse = _outputs_and_grads(UniLM, sparse, params, (ids, mask, seg, pos),
                                                  {})
    _assert_same(out_sparse, out_full)
    _assert_same(grads_sparse, grads_full)


def _dot_flops(jaxpr) -> int:
    """FLOPs of every matrix product in a jaxpr, nested ones included."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(
                np.prod([lhs[d] for d in contract]))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += _dot_flops(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += _dot_flops(sub)
    return total


@pytest.mark.parametrize("sparse", [True, False])
def test_mfu_counts_the_matmul_flops_the_model_computes(sparse):
    """The FLOPs MFU is counted from are those of the model's matmuls (forward x 3)."""
    config = dataclasses.replace(ODD, sparse_last_layer=sparse)
    ids, mask, seg, pos = _batch()
    model = BertForPreTraining(config)
    params = _init(model, ids, mask, seg, pos)
    forward = jax.make_jaxpr(lambda p: model.apply(p, ids, mask, seg, pos))(params)
    counted = metrics.pretraining_flops_per_sequence(config, ids.shape[1], pos.shape[1])
    assert 3 * _dot_flops(forward.jaxpr) == pytest.approx(counted * ids.shape[0])
