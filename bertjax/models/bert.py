"""The BERT encoder as pure-functional Flax Linen modules.

Parameter names mirror the original release (`word_embeddings`, `query`, `key`, `value`,
`attention_output`, `intermediate`, `output`, `pooler`) so checkpoint conversion is a rename
table, and every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`)
that `training/sharding.py` maps onto the device mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any

# "gelu" is the exact x * Phi(x) (erf): google-research/bert's first release (October 2018)
# computed it so, and Hugging Face reads the "gelu" of the released bert_config.json files so.
# The repository's modeling.py has used the tanh approximation since February 2019 (commit
# bee6030, "Adding TF Hub support"): that is "gelu_tanh". They differ by at most 4.7e-4.
ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "gelu_new": functools.partial(nn.gelu, approximate=True),  # Hugging Face's name for it
    "relu": nn.relu,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyperparameters. Field names follow the original `bert_config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pre_layer_norm: bool = False  # post-LN is the original; pre-LN trains deeper stacks stably
    remat: bool = False  # recompute layer activations in the backward pass to save memory
    dtype: Dtype = jnp.float32  # compute dtype (bfloat16 on accelerators)
    param_dtype: Dtype = jnp.float32

    # Keys that describe the architecture, in `bert_config.json` / HF `config.json` spelling.
    ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "intermediate_size", "hidden_act", "hidden_dropout_prob",
                         "attention_probs_dropout_prob", "max_position_embeddings",
                         "type_vocab_size", "initializer_range", "layer_norm_eps",
                         "pre_layer_norm")

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r}: expected one of {sorted(ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.ARCHITECTURE_KEYS}

    @classmethod
    def from_dict(cls, d: dict, **overrides) -> "BertConfig":
        """Reads a bertjax, original TF or Hugging Face config dict; unknown keys are ignored."""
        values = {k: d[k] for k in cls.ARCHITECTURE_KEYS if k in d}
        if "layer_norm_eps" not in values and "layer_norm_epsilon" in d:
            values["layer_norm_eps"] = d["layer_norm_epsilon"]
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                               "num_attention_heads", "intermediate_size") if k not in values]
        if missing:
            raise ValueError(f"model config lacks required keys {missing}")
        return cls(**{**values, **overrides})


def _init(config: BertConfig):
    return nn.initializers.truncated_normal(config.initializer_range)


def _dense(config: BertConfig, features, axes: tuple, name: str, axis=-1):
    """DenseGeneral with logical axis names on kernel and bias."""
    features_t = features if isinstance(features, tuple) else (features,)
    in_axes = axes[: len(axes) - len(features_t)]
    return nn.DenseGeneral(
        features=features, axis=axis, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=nn.with_logical_partitioning(_init(config), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[len(in_axes):]),
        name=name)


def _layer_norm(config: BertConfig, name: str):
    # Flax computes LayerNorm statistics in float32 whatever `dtype` is.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=config.dtype, param_dtype=config.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        name=name)


def _embed(config: BertConfig, num: int, axes: tuple, name: str):
    return nn.Embed(num, config.hidden_size, dtype=config.dtype, param_dtype=config.param_dtype,
                    embedding_init=nn.with_logical_partitioning(_init(config), axes), name=name)


class Embeddings(nn.Module):
    """word + position + token type -> LayerNorm -> dropout."""

    config: BertConfig

    def setup(self):
        c = self.config
        self.word_embeddings = _embed(c, c.vocab_size, ("vocab", "embed"), "word_embeddings")
        self.position_embeddings = _embed(c, c.max_position_embeddings, (None, "embed"),
                                          "position_embeddings")
        self.token_type_embeddings = _embed(c, c.type_vocab_size, (None, "embed"),
                                            "token_type_embeddings")
        self.layer_norm = _layer_norm(c, "layer_norm")
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def __call__(self, input_ids_BL, segment_ids_BL, deterministic: bool, first_position=0):
        """`first_position`: where the tokens start (a decoder fed one token at a time)."""
        length = input_ids_BL.shape[1]
        if length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        x_BLD = (self.word_embeddings(input_ids_BL)
                 + self.position_embeddings(first_position + jnp.arange(length))[None]
                 + self.token_type_embeddings(segment_ids_BL))
        if not self.config.pre_layer_norm:
            x_BLD = self.layer_norm(x_BLD)
        return self.dropout(x_BLD, deterministic=deterministic)

    def attend(self, x_BPD):
        """Logits against the word embeddings (the MLM decoder is tied to them)."""
        return self.word_embeddings.attend(x_BPD)


def multi_head_attention(c: BertConfig, q_BLHK, k_BSHK, v_BSHK, mask_B1LS, deterministic: bool):
    """Scaled dot-product attention of L queries over S keys; called inside a compact module
    (the probabilities' dropout is a submodule of it)."""
    if deterministic or c.attention_probs_dropout_prob == 0.0:
        # The fused path: cuDNN / flash kernels apply on GPU.
        return jax.nn.dot_product_attention(q_BLHK, k_BSHK, v_BSHK, mask=mask_B1LS)
    # dot_product_attention has no dropout on the probabilities, which the original
    # recipe uses; set attention_probs_dropout_prob=0 to train with the fused kernel.
    scores_BHLS = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BSHK).astype(jnp.float32)
    scores_BHLS = scores_BHLS / jnp.sqrt(c.head_dim).astype(jnp.float32)
    scores_BHLS = jnp.where(mask_B1LS, scores_BHLS, jnp.finfo(jnp.float32).min)
    probs_BHLS = jax.nn.softmax(scores_BHLS, axis=-1)
    probs_BHLS = nn.Dropout(c.attention_probs_dropout_prob)(
        probs_BHLS, deterministic=False).astype(c.dtype)
    return jnp.einsum("bhqs,bshk->bqhk", probs_BHLS, v_BSHK)


class Attention(nn.Module):
    """Multi-head self-attention; projections kept per head ([D, H, K]) for tensor sharding."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B11L, deterministic: bool):
        c = self.config
        heads, head_dim = c.num_attention_heads, c.head_dim
        q_BLHK, k_BLHK, v_BLHK = (
            _dense(c, (heads, head_dim), ("embed", "heads", "kv"), name)(x_BLD)
            for name in ("query", "key", "value"))
        out_BLHK = multi_head_attention(c, q_BLHK, k_BLHK, v_BLHK, mask_B11L, deterministic)
        return _dense(c, c.hidden_size, ("heads", "kv", "embed"), "attention_output",
                      axis=(-2, -1))(out_BLHK)


def residual(c: BertConfig, x_BLD, norm, sublayer, dropout, deterministic: bool):
    """x + dropout(sublayer(x)), LayerNorm after the sum (post-LN) or on the way in (pre-LN)."""
    h_BLD = norm(x_BLD) if c.pre_layer_norm else x_BLD
    x_BLD = x_BLD + dropout(sublayer(h_BLD), deterministic=deterministic)
    return x_BLD if c.pre_layer_norm else norm(x_BLD)


def feed_forward(c: BertConfig, h_BLD):
    """intermediate dense + activation + output dense; called inside a compact module."""
    h_BLF = ACTIVATIONS[c.hidden_act](
        _dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(h_BLD))
    return _dense(c, c.hidden_size, ("mlp", "embed"), "output")(h_BLF)


class TransformerLayer(nn.Module):
    """Attention + feed-forward, each with residual and LayerNorm (post-LN or pre-LN)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B11L, deterministic: bool):
        c = self.config
        dropout = nn.Dropout(c.hidden_dropout_prob)
        attention = Attention(c, name="attention")
        x_BLD = residual(c, x_BLD, _layer_norm(c, "attention_layer_norm"),
                         lambda h: attention(h, mask_B11L, deterministic), dropout,
                         deterministic)
        return residual(c, x_BLD, _layer_norm(c, "output_layer_norm"),
                        lambda h: feed_forward(c, h), dropout, deterministic)


class Encoder(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B11L, deterministic: bool):
        c = self.config
        layer_cls = TransformerLayer
        if c.remat:
            layer_cls = nn.remat(TransformerLayer, static_argnums=(3,))
        for i in range(c.num_hidden_layers):
            x_BLD = layer_cls(c, name=f"layer_{i}")(x_BLD, mask_B11L, deterministic)
        if c.pre_layer_norm:
            x_BLD = _layer_norm(c, "final_layer_norm")(x_BLD)
        return x_BLD


class BertModel(nn.Module):
    """Embeddings -> encoder -> pooler. Returns (sequence_output [B,L,D], pooled_output [B,D])."""

    config: BertConfig

    def setup(self):
        c = self.config
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        # The pooler is square; its output axis is sharded like an MLP hidden dimension.
        self.pooler = _dense(c, c.hidden_size, ("embed", "mlp"), "pooler")

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True,
                 attention_mask=None):
        """`attention_mask` [B, 1, L, L] (who attends to whom, e.g. the one-stack seq2seq
        mask) replaces the padding mask made from `input_mask`."""
        mask_B11L = (input_mask.astype(bool)[:, None, None, :] if attention_mask is None
                     else attention_mask)
        x_BLD = self.embeddings(input_ids, segment_ids, deterministic)
        x_BLD = self.encoder(x_BLD, mask_B11L, deterministic)
        pooled_BD = jnp.tanh(self.pooler(x_BLD[:, 0]))
        return x_BLD, pooled_BD

    def attend(self, x_BPD):
        return self.embeddings.attend(x_BPD)
