"""Task heads: shapes, a `bert` subtree that a pretraining checkpoint fills as-is, logical axes
on every head parameter, and head outputs equal to the documented linear map."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models.bert import BertConfig
from bertjax.models.heads import (BertForPreTraining, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)

CONFIG = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=16)
B, L = 3, 7


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 99, (B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    mask[1, 4:] = 0
    return ids, mask, (np.arange(L)[None] >= 3).astype(np.int32).repeat(B, 0)


def _init(model):
    ids, mask, seg = _batch()
    return model.init(jax.random.key(0), ids, mask, seg)["params"]


def _shapes(tree):
    return jax.tree.map(lambda x: x.shape, nn.unbox(tree))


@pytest.mark.parametrize("model,head", [
    (BertForSequenceClassification(CONFIG, num_labels=3), "classifier"),
    (BertForTokenClassification(CONFIG, num_labels=5), "classifier"),
    (BertForQuestionAnswering(CONFIG), "qa_outputs"),
])
def test_bert_subtree_matches_pretraining_and_head_is_partitioned(model, head):
    params = _init(model)
    assert set(params) == {"bert", head}
    pretraining = _init_pretraining()
    assert _shapes(params["bert"]) == _shapes(pretraining["bert"])
    for leaf in jax.tree.leaves(params[head], is_leaf=lambda x: isinstance(x, nn.Partitioned)):
        assert isinstance(leaf, nn.Partitioned), f"{head} parameter without logical axes"
    assert params[head]["kernel"].names == ("embed", None)


def _init_pretraining():
    ids, mask, seg = _batch()
    return BertForPreTraining(CONFIG).init(jax.random.key(1), ids, mask, seg,
                                           np.zeros((B, 2), np.int32))["params"]


def test_sequence_classification_is_linear_on_pooled_output():
    model = BertForSequenceClassification(CONFIG, num_labels=3)
    params = nn.unbox(_init(model))
    ids, mask, seg = _batch()
    logits = model.apply({"params": params}, ids, mask, seg)
    _, pooled = model.apply({"params": params}, ids, mask, seg,
                            method=lambda m, *a: m.bert(*a, deterministic=True))
    head = params["classifier"]
    assert logits.shape == (B, 3) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, pooled @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-6)
    regression = BertForSequenceClassification(CONFIG, num_labels=1)
    assert regression.apply(regression.init(jax.random.key(0), ids, mask, seg),
                            ids, mask, seg).shape == (B, 1)


def test_token_classification_and_qa_score_every_position():
    ids, mask, seg = _batch()
    tagger = BertForTokenClassification(CONFIG, num_labels=5)
    tparams = nn.unbox(_init(tagger))
    tags = tagger.apply({"params": tparams}, ids, mask, seg)
    seq, _ = tagger.apply({"params": tparams}, ids, mask, seg,
                          method=lambda m, *a: m.bert(*a, deterministic=True))
    assert tags.shape == (B, L, 5)
    np.testing.assert_allclose(tags, seq @ tparams["classifier"]["kernel"]
                               + tparams["classifier"]["bias"], rtol=1e-5, atol=1e-6)

    qa = BertForQuestionAnswering(CONFIG)
    qparams = nn.unbox(_init(qa))
    out = qa.apply({"params": qparams}, ids, mask, seg)
    assert out["start_logits"].shape == out["end_logits"].shape == (B, L)
    seq, _ = qa.apply({"params": qparams}, ids, mask, seg,
                      method=lambda m, *a: m.bert(*a, deterministic=True))
    both = seq @ qparams["qa_outputs"]["kernel"] + qparams["qa_outputs"]["bias"]
    np.testing.assert_allclose(out["start_logits"], both[..., 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["end_logits"], both[..., 1], rtol=1e-5, atol=1e-6)


def test_dropout_applies_only_when_training():
    model = BertForSequenceClassification(CONFIG.__class__(**{**CONFIG.__dict__,
                                                            "hidden_dropout_prob": 0.5}), 2)
    ids, mask, seg = _batch()
    variables = model.init(jax.random.key(0), ids, mask, seg)
    eval_a = model.apply(variables, ids, mask, seg)
    eval_b = model.apply(variables, ids, mask, seg)
    train = model.apply(variables, ids, mask, seg, deterministic=False,
                        rngs={"dropout": jax.random.key(3)})
    np.testing.assert_array_equal(eval_a, eval_b)
    assert not np.allclose(train, eval_a)
