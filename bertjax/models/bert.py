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
import flax.struct
import jax
import jax.numpy as jnp

from bertjax import batching
from bertjax.models import attention as attention_lib
from bertjax.models.dropout import MASK_BITS, make_dropout

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
    # What remat keeps from the forward pass: a jax.checkpoint_policies name
    # (nothing_saveable: recompute everything; dots_with_no_batch_dims_saveable: keep the
    # projections' outputs, recompute the rest).
    remat_policy: str = "nothing_saveable"
    # One layer traced once and run num_hidden_layers times (jax.lax.scan): the program no
    # longer grows with depth. The parameters keep their per-layer layout.
    scan_layers: bool = False
    # Random bits per dropout mask element: 16 halves the random number generation, a large
    # share of a step on CPUs; 32 is Flax's nn.Dropout (models/dropout.py).
    dropout_mask_bits: int = 16
    # The last layer computes only the positions the heads read (BertModel's
    # `output_positions` and the [CLS]s), its keys and values still from every position: the
    # same outputs for fewer FLOPs. Dropout masks of that layer have the smaller shape, so a
    # run draws other masks than with False.
    sparse_last_layer: bool = True
    # Self-attention's implementation (models/attention.py): xla (jax.nn.dot_product_attention,
    # or explicit scores when the probabilities drop out) | splash (TPU's Pallas kernel: no
    # [B, H, L, L] scores kept; needs attention_probs_dropout_prob=0; lengths that are not
    # multiples of 128, the sparse last layer's queries and explicit attention masks run xla).
    attention: str = "xla"
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
        if self.dropout_mask_bits not in MASK_BITS:
            raise ValueError(f"dropout_mask_bits {self.dropout_mask_bits}: expected one of "
                             f"{', '.join(map(str, MASK_BITS))}")
        if self.attention not in attention_lib.ATTENTIONS:
            raise ValueError(f"attention {self.attention!r}: expected one of "
                             f"{', '.join(attention_lib.ATTENTIONS)}")
        if self.attention == "splash" and self.attention_probs_dropout_prob:
            raise ValueError(f"attention 'splash' has no dropout on the attention "
                             f"probabilities: set attention_probs_dropout_prob to 0, not "
                             f"{self.attention_probs_dropout_prob}")
        if not hasattr(jax.checkpoint_policies, self.remat_policy):
            raise ValueError(f"remat_policy {self.remat_policy!r}: expected a name of "
                             f"jax.checkpoint_policies (nothing_saveable, "
                             f"dots_with_no_batch_dims_saveable, ...)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.ARCHITECTURE_KEYS}

    # How the encoder runs, not what it is: a config's `model` section sets these over any
    # architecture (the preset's in pretraining, the checkpoint's in fine-tuning).
    RUN_OPTIONS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "remat", "remat_policy",
                   "scan_layers", "dropout_mask_bits", "sparse_last_layer", "attention")

    @classmethod
    def from_config(cls, model: Any, base: "BertConfig | None" = None, *,
                    vocab_size: int | None = None, platform: str | None = None) -> "BertConfig":
        """The encoder a config's `model` section describes, computing in its dtype on
        `platform` (see compute_dtype).

        Fine-tuning gives `base`, the checkpoint's architecture, of which the section keeps
        the first `keep_layers` layers (None: all). Pretraining's section names the
        architecture itself, with `model.vocab_size` or else the tokenizer's `vocab_size`.
        """
        if base is None:
            if model.vocab_size is not None and model.vocab_size < vocab_size:
                raise ValueError(f"model.vocab_size {model.vocab_size} is smaller than the "
                                 f"tokenizer's vocabulary ({vocab_size})")
            base = cls.from_dict({**model, "vocab_size": model.vocab_size or vocab_size})
        elif model.keep_layers is not None:
            if not 0 < model.keep_layers <= base.num_hidden_layers:
                raise ValueError(f"model.keep_layers {model.keep_layers}: the checkpoint has "
                                 f"{base.num_hidden_layers} layers")
            base = dataclasses.replace(base, num_hidden_layers=model.keep_layers)
        return dataclasses.replace(base, **{k: model[k] for k in cls.RUN_OPTIONS},
                                   dtype=compute_dtype(model.dtype, platform))

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


def compute_dtype(name: str, platform: str | None = None):
    """The compute dtype `name` means on `platform` (default: this process's backend): `auto`
    is bfloat16 on accelerators, float32 on CPUs."""
    if name == "auto":
        platform = platform or jax.default_backend()
        name = "bfloat16" if platform in ("gpu", "tpu") else "float32"
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


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
        self.dropout = make_dropout(c.hidden_dropout_prob, c.dropout_mask_bits)

    def __call__(self, input_ids_BL, segment_ids_BL, deterministic: bool, position_ids_BL=None,
                 first_position=0):
        """`position_ids_BL`: each token's position (packed rows restart it per example);
        otherwise they count from `first_position` (a decoder fed one token at a time)."""
        length = input_ids_BL.shape[1]
        if length > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        if position_ids_BL is None:
            positions_BLD = self.position_embeddings(first_position + jnp.arange(length))[None]
        else:
            positions_BLD = self.position_embeddings(position_ids_BL)
        x_BLD = (self.word_embeddings(input_ids_BL) + positions_BLD
                 + self.token_type_embeddings(segment_ids_BL))
        if not self.config.pre_layer_norm:
            x_BLD = self.layer_norm(x_BLD)
        return self.dropout(x_BLD, deterministic=deterministic)

    def attend(self, x_BPD):
        """Logits against the word embeddings (the MLM decoder is tied to them)."""
        x_BPD, embedding_VD = self.word_embeddings.promote_dtype(
            x_BPD, self.word_embeddings.embedding, dtype=self.config.dtype)
        return tied_logits(x_BPD, embedding_VD)


@jax.custom_vjp
def tied_logits(x_ND, embedding_VD):
    """x against every word embedding: [..., D], [V, D] -> [..., V].

    The embedding's gradient is computed as x^T g, then transposed: JAX's own rule computes
    g^T x, for which XLA:CPU first transposes g, the [predictions, vocabulary] logits
    gradient (20 ms of a mini pretraining step), where x^T is 40 times smaller."""
    return jnp.einsum("...d,vd->...v", x_ND, embedding_VD)


def _tied_logits_fwd(x_ND, embedding_VD):
    return tied_logits(x_ND, embedding_VD), (x_ND, embedding_VD)


def _tied_logits_bwd(residuals, g_NV):
    x_ND, embedding_VD = residuals
    g_x_ND = jnp.einsum("...v,vd->...d", g_NV, embedding_VD)
    g_embedding_DV = jnp.einsum("...d,...v->dv", x_ND, g_NV)
    return g_x_ND, g_embedding_DV.T


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def multi_head_attention(c: BertConfig, q_BLHK, k_BSHK, v_BSHK, mask_B1LS, deterministic: bool):
    """Scaled dot-product attention of L queries over S keys; called inside a compact module
    (the probabilities' dropout is a submodule of it). The mask is a bool array [B, 1, L|1,
    S], or an `attention.SegmentMask` (attention='splash')."""
    if isinstance(mask_B1LS, attention_lib.SegmentMask):
        if attention_lib.splash_fits(q_BLHK.shape[1], k_BSHK.shape[1]):
            # attention='splash' implies attention_probs_dropout_prob=0 (BertConfig checks).
            return attention_lib.splash_attention(q_BLHK, k_BSHK, v_BSHK, mask_B1LS)
        mask_B1LS = mask_B1LS.dense()
    if deterministic or c.attention_probs_dropout_prob == 0.0:
        # The fused path: cuDNN / flash kernels apply on GPU.
        return jax.nn.dot_product_attention(q_BLHK, k_BSHK, v_BSHK, mask=mask_B1LS)
    # dot_product_attention has no dropout on the probabilities, which the original
    # recipe uses; set attention_probs_dropout_prob=0 to train with the fused kernel.
    scores_BHLS = jnp.einsum("bqhk,bshk->bhqs", q_BLHK, k_BSHK).astype(jnp.float32)
    scores_BHLS = scores_BHLS / jnp.sqrt(c.head_dim).astype(jnp.float32)
    scores_BHLS = jnp.where(mask_B1LS, scores_BHLS, jnp.finfo(jnp.float32).min)
    probs_BHLS = jax.nn.softmax(scores_BHLS, axis=-1)
    probs_BHLS = make_dropout(c.attention_probs_dropout_prob, c.dropout_mask_bits)(
        probs_BHLS, deterministic=False).astype(c.dtype)
    return jnp.einsum("bhqs,bshk->bqhk", probs_BHLS, v_BSHK)


class Attention(nn.Module):
    """Multi-head self-attention; projections kept per head ([D, H, K]) for tensor sharding.

    The mask is [B, 1, 1, L] (padding) or [B, 1, L, L] (packed rows: one block per example).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x_BQD, kv_BLD, mask_B1QL, deterministic: bool):
        """Queries from `x_BQD`, keys and values from `kv_BLD` (the same array, or the whole
        sequence when only some positions' outputs are computed)."""
        c = self.config
        heads, head_dim = c.num_attention_heads, c.head_dim
        q_BQHK = _dense(c, (heads, head_dim), ("embed", "heads", "kv"), "query")(x_BQD)
        k_BLHK, v_BLHK = (_dense(c, (heads, head_dim), ("embed", "heads", "kv"), name)(kv_BLD)
                          for name in ("key", "value"))
        out_BQHK = multi_head_attention(c, q_BQHK, k_BLHK, v_BLHK, mask_B1QL, deterministic)
        return _dense(c, c.hidden_size, ("heads", "kv", "embed"), "attention_output",
                      axis=(-2, -1))(out_BQHK)


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


def gather_positions(x_BLD, positions_BP):
    """x at the given sequence positions: [B, L, D], [B, P] -> [B, P, D]."""
    return jnp.take_along_axis(x_BLD, positions_BP[:, :, None].astype(jnp.int32), axis=1)


def mask_rows(mask_B1QL, positions_BP):
    """The attention mask's rows for the queries at `positions_BP`; a padding mask [B, 1, 1,
    L] is the same row for every query."""
    if isinstance(mask_B1QL, attention_lib.SegmentMask):
        return mask_B1QL.rows(positions_BP)
    if mask_B1QL.shape[2] == 1:
        return mask_B1QL
    rows_B1P1 = positions_BP[:, None, :, None].astype(jnp.int32)
    return jnp.take_along_axis(mask_B1QL, rows_B1P1, axis=2)


class TransformerLayer(nn.Module):
    """Attention + feed-forward, each with residual and LayerNorm (post-LN or pre-LN).

    `positions_BP`: compute only these positions' outputs ([B, P, D]); every position still
    gives keys and values. What the last layer does when the heads read a few positions.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B1QL, deterministic: bool, positions_BP=None):
        c = self.config
        dropout = make_dropout(c.hidden_dropout_prob, c.dropout_mask_bits)
        attention = Attention(c, name="attention")
        attention_norm = _layer_norm(c, "attention_layer_norm")
        kv_BLD = None  # self-attention: keys and values from the queries' own input
        if positions_BP is not None:
            kv_BLD = attention_norm(x_BLD) if c.pre_layer_norm else x_BLD
            x_BLD = gather_positions(x_BLD, positions_BP)
            mask_B1QL = mask_rows(mask_B1QL, positions_BP)
        x_BLD = residual(c, x_BLD, attention_norm,
                         lambda h: attention(h, h if kv_BLD is None else kv_BLD, mask_B1QL,
                                             deterministic), dropout, deterministic)
        return residual(c, x_BLD, _layer_norm(c, "output_layer_norm"),
                        lambda h: feed_forward(c, h), dropout, deterministic)


def _layer_class(config: BertConfig):
    if not config.remat:
        return TransformerLayer
    return nn.remat(TransformerLayer, static_argnums=(3,),
                    policy=getattr(jax.checkpoint_policies, config.remat_policy))


class Encoder(nn.Module):
    """The layers; `positions_BP` (sparse_last_layer): the last one computes only those."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B1QL, deterministic: bool, positions_BP=None):
        c = self.config
        layer_cls = _layer_class(c)
        last = c.num_hidden_layers - 1
        for i in range(c.num_hidden_layers):
            x_BLD = layer_cls(c, name=f"layer_{i}")(x_BLD, mask_B1QL, deterministic,
                                                     positions_BP if i == last else None)
        if c.pre_layer_norm:
            x_BLD = _layer_norm(c, "final_layer_norm")(x_BLD)
        return x_BLD


class _ScanStep(nn.Module):
    """One layer as a scan step: (carry, broadcast mask) -> (carry, nothing)."""

    config: BertConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x_BLD, mask_B1QL):
        layer = _layer_class(self.config)(self.config, name="layer")
        return layer(x_BLD, mask_B1QL, self.deterministic), None


# The stacked axis of scanned parameters carries no logical name: never sharded.
_SCAN_AXIS = {nn.PARTITION_NAME: None}


def _scanned_count(config: BertConfig) -> int:
    """How many layers the scan runs: all, or all but the last when that one computes only
    some positions (another shape, so it runs on its own as `layer_{N-1}`)."""
    return config.num_hidden_layers - config.sparse_last_layer


class _ScannedEncoder(nn.Module):
    """The encoder as one layer scanned over the depth, over its parameters stacked
    {'layers': {'layer': [N, ...]}} (with sparse_last_layer, the last layer apart);
    `scanned_encoder` gives it Encoder's layout."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BLD, mask_B1QL, deterministic: bool, positions_BP=None):
        c = self.config
        count = _scanned_count(c)
        if count:
            # Each layer its own parameters and its own dropout stream.
            layers = nn.scan(_ScanStep, variable_axes={"params": 0},
                             split_rngs={"params": True, "dropout": True},
                             in_axes=nn.broadcast, length=count, metadata_params=_SCAN_AXIS)
            x_BLD, _ = layers(c, deterministic, name="layers")(x_BLD, mask_B1QL)
        if count < c.num_hidden_layers:
            x_BLD = _layer_class(c)(c, name=f"layer_{count}")(x_BLD, mask_B1QL, deterministic,
                                                              positions_BP)
        if c.pre_layer_norm:
            x_BLD = _layer_norm(c, "final_layer_norm")(x_BLD)
        return x_BLD


def _is_box(x) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def _stacked(params: dict, count: int) -> dict:
    """Encoder's per-layer parameters (layer_0, layer_1, ...) as _ScannedEncoder's: the first
    `count` layers stacked."""
    if "layer_0" not in params or not count:  # initialising: nothing to stack yet
        return params

    def stack(*xs):
        if _is_box(xs[0]):  # logical axis names gain the new axis
            return xs[0].replace_boxed(jnp.stack([x.unbox() for x in xs])).add_axis(
                0, _SCAN_AXIS)
        return jnp.stack(xs)

    names = [f"layer_{i}" for i in range(count)]
    rest = {k: v for k, v in params.items() if k not in names}
    layers = [params[name] for name in names]
    return {**rest, "layers": {"layer": jax.tree.map(stack, *layers, is_leaf=_is_box)}}


def _per_layer(params: dict) -> dict:
    """_ScannedEncoder's stacked parameters as Encoder's per-layer ones."""
    if "layers" not in params:
        return params
    stacked = params["layers"]["layer"]
    count = jax.tree.leaves(stacked)[0].shape[0]

    def take(x, i):
        if _is_box(x):  # logical axis names lose the stacked axis
            return x.remove_axis(0, _SCAN_AXIS).replace_boxed(x.unbox()[i])
        return x[i]

    rest = {k: v for k, v in params.items() if k != "layers"}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x, i=i: take(x, i), stacked,
                                                  is_leaf=_is_box) for i in range(count)}}


def scanned_encoder(config: BertConfig, init: bool, name: str) -> nn.Module:
    """The scanned encoder with Encoder's parameter layout (layer_0, layer_1, ...): stacked
    for the scan on the way in, so checkpoints, conversion and export never see the scan."""
    def each(fn):
        return lambda collections: {c: fn(v) for c, v in collections.items()}
    stacked = functools.partial(_stacked, count=_scanned_count(config))
    return nn.map_variables(_ScannedEncoder, "params", trans_in_fn=each(stacked),
                            trans_out_fn=each(_per_layer), init=init,
                            mutable=init)(config, name=name)


@flax.struct.dataclass
class Packing:
    """Rows that hold several examples each (batching.py's packed rows): what keeps every
    example as it would be alone in its row.

    `position_ids` [B, L]: each token's position in its example (restarting at 0);
    `example_ids` [B, L]: 1, 2, ... per example, 0 on padding (a token attends to its own
    example's tokens only); `cls_positions` [B, E]: each example's [CLS], where it is pooled.
    """

    position_ids: jax.Array
    example_ids: jax.Array
    cls_positions: jax.Array

    @classmethod
    def from_batch(cls, batch: dict) -> "Packing | None":
        """The packing of a batch under the batching contract (`batching.PACKING_INPUTS`), or
        None for rows of one example each."""
        if not any(k in batch for k in batching.PACKING_INPUTS):
            return None
        missing = [k for k in batching.PACKING_INPUTS if k not in batch]
        if missing:
            raise ValueError(f"a packed batch lacks {missing}: packed rows carry all of "
                             f"{batching.PACKING_INPUTS}")
        return cls(*(batch[k] for k in batching.PACKING_INPUTS))

    def attention_mask(self):
        """Each token attends only to the tokens of its own example: [B, 1, L, L] bool."""
        ids_BL = self.example_ids
        same_B1LL = ids_BL[:, None, :, None] == ids_BL[:, None, None, :]
        return same_B1LL & (ids_BL > 0)[:, None, None, :]


class BertModel(nn.Module):
    """Embeddings -> encoder -> pooler.

    Returns (outputs, pooled): one output per position read and one pooled vector per
    example. `outputs` is [B, L, D], or [B, P, D] given `output_positions` [B, P]; `pooled`
    (the tanh-dense [CLS] output) is [B, D], or [B, E, D] given a `packing` of E examples a
    row, every example computed as it would be alone in its row.
    """

    config: BertConfig

    def setup(self):
        c = self.config
        self.embeddings = Embeddings(c)
        if c.scan_layers:
            self.encoder = scanned_encoder(c, self.is_initializing(), "encoder")
        else:
            self.encoder = Encoder(c)
        # The pooler is square; its output axis is sharded like an MLP hidden dimension.
        self.pooler = _dense(c, c.hidden_size, ("embed", "mlp"), "pooler")

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True, *,
                 packing: Packing | None = None, attention_mask=None, output_positions=None):
        """`packing`: rows of several examples (see Packing). `attention_mask` [B, 1, L, L]
        (who attends to whom, e.g. the one-stack seq2seq mask) replaces the padding mask made
        from `input_mask`; it does not combine with `packing`.

        `output_positions` [B, P]: the positions a head reads (P may be 0: the pooled [CLS]
        alone). With `sparse_last_layer` the last layer computes only these and the [CLS]s.
        """
        if attention_mask is not None and packing is not None:
            raise ValueError("BertModel takes an attention_mask or a packing, not both")
        if attention_mask is not None:
            mask = attention_mask
        elif self.config.attention == "splash":  # the kernel's form of the same masks
            mask = (attention_lib.padding_segments(input_mask) if packing is None
                    else attention_lib.packed_segments(packing.example_ids))
        elif packing is None:
            mask = input_mask.astype(bool)[:, None, None, :]
        else:
            mask = packing.attention_mask()
        x_BLD = self.embeddings(input_ids, segment_ids, deterministic,
                                None if packing is None else packing.position_ids)
        if output_positions is not None and self.config.sparse_last_layer:
            cls_BE = (jnp.zeros((input_ids.shape[0], 1), jnp.int32) if packing is None
                      else packing.cls_positions.astype(jnp.int32))
            read_BQ = jnp.concatenate([cls_BE, output_positions.astype(jnp.int32)], axis=1)
            x_BQD = self.encoder(x_BLD, mask, deterministic, read_BQ)
            cls_BED, x_BPD = x_BQD[:, :cls_BE.shape[1]], x_BQD[:, cls_BE.shape[1]:]
            if packing is None:
                cls_BED = cls_BED[:, 0]
        else:
            x_BLD = self.encoder(x_BLD, mask, deterministic)
            cls_BED = (x_BLD[:, 0] if packing is None
                       else gather_positions(x_BLD, packing.cls_positions))
            x_BPD = (x_BLD if output_positions is None
                     else gather_positions(x_BLD, output_positions))
        return x_BPD, jnp.tanh(self.pooler(cls_BED))

    def attend(self, x_BPD):
        return self.embeddings.attend(x_BPD)
