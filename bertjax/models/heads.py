"""Heads on top of `BertModel`: pretraining (masked LM at gathered positions, NSP) and the
fine-tuning tasks (sequence classification / regression, token tagging, extractive QA)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import meshes
from bertjax.models.bert import ACTIVATIONS, BertConfig, BertModel, Packing, _dense, _layer_norm
from bertjax.models.dropout import make_dropout


class MaskedLMHead(nn.Module):
    """dense + activation + LayerNorm, then the tied word-embedding decoder plus an output bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BPD, decode):
        c = self.config
        h_BPD = _dense(c, c.hidden_size, ("embed", "mlp"), "transform")(x_BPD)
        h_BPD = _layer_norm(c, "layer_norm")(ACTIVATIONS[c.hidden_act](h_BPD))
        bias_V = self.param("output_bias", nn.with_logical_partitioning(
            nn.initializers.zeros, ("vocab",)), (c.vocab_size,), c.param_dtype)
        # Batch-sharded with whole features. Without this XLA's SPMD partitioner (jaxlib
        # 0.10.2, Shardy and GSPMD alike) computes wrong gradients for the transform and
        # LayerNorm above on meshes with data, fsdp and tensor all > 1 (the forward pass is
        # right); it is the layout the partitioner picks anyway elsewhere. The mesh is the
        # one the activations are laid out on, not a global mesh context, which would make
        # Flax constrain DenseGeneral's multi-axis kernels at their flat initial shape, which
        # fails (models/meshes.py). Without a mesh this is a no-op.
        h_BPD = meshes.constrain(h_BPD, ("batch", None, None))
        return add_output_bias(decode(h_BPD), bias_V.astype(c.dtype))


@jax.custom_vjp
def add_output_bias(logits_BPV, bias_V):
    """logits + bias, whose bias gradient (the sum of the logits' gradient over B and P) is
    a vector-matrix product: XLA:CPU reduces [B*P, V] over its leading axis one column at a
    time, 30 to 40 times slower than the product (49 ms of a 1 s mini pretraining step)."""
    return logits_BPV + bias_V


def _add_output_bias_fwd(logits_BPV, bias_V):
    return logits_BPV + bias_V, None


def _add_output_bias_bwd(_, g_BPV):
    rows = g_BPV.reshape(-1, g_BPV.shape[-1])
    ones = jnp.ones((rows.shape[0],), rows.dtype)
    return g_BPV, jnp.dot(ones, rows, preferred_element_type=jnp.float32).astype(g_BPV.dtype)


add_output_bias.defvjp(_add_output_bias_fwd, _add_output_bias_bwd)


class BertForPreTraining(nn.Module):
    """Encoder + MLM head evaluated only at `masked_lm_positions` + NSP head on the pooled [CLS].

    Returns {'mlm_logits': [B, P, V] float32, 'nsp_logits': [B, 2] float32}. Projecting only
    the P gathered positions (not all L) onto the vocabulary is most of the head's saving.
    """

    config: BertConfig
    num_inputs = 4  # what init_params passes: the three inputs and masked_lm_positions

    def setup(self):
        self.bert = BertModel(self.config)
        self.mlm = MaskedLMHead(self.config)
        self.nsp = _dense(self.config, 2, ("embed", None), "nsp")

    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
                 deterministic: bool = True, packing: Packing | None = None):
        """Packed rows (data/packing.py) of K examples: 'nsp_logits' is [B, K, 2], one per
        example."""
        x_BPD, pooled_BD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                     packing=packing, output_positions=masked_lm_positions)
        mlm_logits_BPV = self.mlm(x_BPD, self.bert.attend)
        nsp_logits_B2 = self.nsp(pooled_BD)
        return {"mlm_logits": mlm_logits_BPV.astype(jnp.float32),
                "nsp_logits": nsp_logits_B2.astype(jnp.float32)}


def init_params(model: nn.Module, rng) -> dict:
    """The (logically partitioned) parameters of any model of this package, initialised from
    dummy inputs (parameter shapes do not depend on the input's). A model taking more than
    the three encoder inputs says how many in `num_inputs`. Jitted: run eagerly, each of the
    initialisers' hundreds of small ops would be compiled on its own (seconds on a CPU)."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.jit(model.init)(rng, *(ids,) * getattr(model, "num_inputs", 3))["params"]


def param_shapes(model: nn.Module) -> dict:
    """ShapeDtypeStructs of the model's parameters (nothing is computed)."""
    return nn.unbox(jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0))))


class BertForSequenceClassification(nn.Module):
    """Dropout + dense on the pooled [CLS]: [B, num_labels] float32 logits ([B, E,
    num_labels] for packed rows: see BertModel).

    num_labels=1 is regression (STS-B): the single logit is the predicted score.
    """

    config: BertConfig
    num_labels: int
    read_positions = 1  # per example, the [CLS]: all a sparse last layer computes (metrics)

    def setup(self):
        self.bert = BertModel(self.config)
        self.dropout = make_dropout(self.config.hidden_dropout_prob,
                                    self.config.dropout_mask_bits)
        self.classifier = _dense(self.config, self.num_labels, ("embed", None), "classifier")

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True,
                 packing: Packing | None = None):
        no_positions = jnp.zeros((input_ids.shape[0], 0), jnp.int32)  # the [CLS]s alone
        _, pooled_BD = self.bert(input_ids, input_mask, segment_ids, deterministic,
                                 packing=packing, output_positions=no_positions)
        pooled_BD = self.dropout(pooled_BD, deterministic=deterministic)
        return self.classifier(pooled_BD).astype(jnp.float32)


class BertForTokenClassification(nn.Module):
    """Dropout + dense at every position (tagging, NER): [B, L, num_labels] float32 logits
    (packed rows too: the positions of all their examples)."""

    config: BertConfig
    num_labels: int

    def setup(self):
        self.bert = BertModel(self.config)
        self.dropout = make_dropout(self.config.hidden_dropout_prob,
                                    self.config.dropout_mask_bits)
        self.classifier = _dense(self.config, self.num_labels, ("embed", None), "classifier")

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True,
                 packing: Packing | None = None):
        x_BLD, _ = self.bert(input_ids, input_mask, segment_ids, deterministic, packing=packing)
        x_BLD = self.dropout(x_BLD, deterministic=deterministic)
        return self.classifier(x_BLD).astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
    """Dense to two scores per position (extractive QA, as the original run_squad).

    Returns {'start_logits': [B, L], 'end_logits': [B, L]} float32; position 0 ([CLS]) is
    the no-answer span.
    """

    config: BertConfig

    def setup(self):
        self.bert = BertModel(self.config)
        self.qa_outputs = _dense(self.config, 2, ("embed", None), "qa_outputs")

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
        x_BLD, _ = self.bert(input_ids, input_mask, segment_ids, deterministic)
        logits_BL2 = self.qa_outputs(x_BLD).astype(jnp.float32)
        return {"start_logits": logits_BL2[..., 0], "end_logits": logits_BL2[..., 1]}
