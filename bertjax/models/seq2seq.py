"""BERT for generation: BERT2BERT, a BERT encoder with a BERT decoder warm-started from the
same checkpoint (Rothe, Narayan and Severyn 2020), and the one-stack seq2seq mask (UniLM,
Dong et al. 2019).

The decoder is transformers' `BertLMHeadModel` with `add_cross_attention`: each layer is
causal self-attention, then cross-attention over the encoder's output (its own output dense
and LayerNorm), then the feed-forward block; the LM head is the MLM head (transform dense +
activation + LayerNorm, decoder tied to the decoder's word embeddings, output bias). Its
parameters sit under `decoder/bert` and `decoder/mlm` as a `BertForPreTraining`'s sit under
`bert` and `mlm`, so a pretrained model warm-starts it tensor by tensor; only the
`crossattention*` parameters are new.

Decoding feeds one token at a time against a fixed-size key/value cache (the `cache`
collection, `cache_length` positions): the first `decode` call creates it, with the
cross-attention keys and values of the encoder output computed once; every later call writes
one position. Shapes never change, so a decoding loop compiles once.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models.bert import (BertConfig, BertModel, Embeddings, _dense, _layer_norm,
                                 feed_forward, multi_head_attention, residual)
from bertjax.models.dropout import make_dropout
from bertjax.models.heads import MaskedLMHead


def causal_mask(input_mask_BT):
    """[B, 1, T, T]: position t attends to the real positions up to t."""
    length = input_mask_BT.shape[1]
    causal_TT = jnp.tril(jnp.ones((length, length), bool))
    return causal_TT[None, None] & input_mask_BT.astype(bool)[:, None, None, :]


def seq2seq_mask(input_mask_BL, segment_ids_BL):
    """UniLM's mask over `[CLS] source [SEP] target [SEP]` [B, 1, L, L]: source tokens
    (segment 0) attend to the source only; target tokens (segment 1) to the source and to
    the target up to themselves."""
    length = input_mask_BL.shape[1]
    causal_1LL = jnp.tril(jnp.ones((length, length), bool))[None]
    source_key_B1L = (segment_ids_BL == 0)[:, None, :]
    target_query_BL1 = (segment_ids_BL == 1)[:, :, None]
    allowed_BLL = source_key_B1L | (target_query_BL1 & causal_1LL)
    return (allowed_BLL & input_mask_BL.astype(bool)[:, None, :])[:, None]


def _projections(c: BertConfig, names):
    return [_dense(c, (c.num_attention_heads, c.head_dim), ("embed", "heads", "kv"), name)
            for name in names]


def _output(c: BertConfig, out_BTHK):
    return _dense(c, c.hidden_size, ("heads", "kv", "embed"), "attention_output",
                  axis=(-2, -1))(out_BTHK)


class CausalSelfAttention(nn.Module):
    """BERT's self-attention (same parameters) over the tokens so far. With `decode_at` (the
    position of the first of the given tokens), keys and values go into the cache and the
    queries attend to the cache up to themselves."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BTD, mask_B1TT, deterministic: bool, decode_at=None,
                 cache_length: int = 0):
        c = self.config
        query, key, value = _projections(c, ("query", "key", "value"))
        q_BTHK, k_BTHK, v_BTHK = query(x_BTD), key(x_BTD), value(x_BTD)
        if decode_at is not None:
            batch, length = x_BTD.shape[:2]
            shape = (batch, cache_length, c.num_attention_heads, c.head_dim)
            cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, k_BTHK.dtype)
            cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, v_BTHK.dtype)
            start = (0, decode_at, 0, 0)
            cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BTHK, start)
            cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BTHK, start)
            k_BTHK, v_BTHK = cached_k.value, cached_v.value
            mask_B1TT = (jnp.arange(cache_length)[None, :]
                         <= decode_at + jnp.arange(length)[:, None])[None, None]
        return _output(c, multi_head_attention(c, q_BTHK, k_BTHK, v_BTHK, mask_B1TT,
                                               deterministic))


class CrossAttention(nn.Module):
    """Queries from the decoder, keys and values from the encoder output (BERT's attention
    parameter names). When decoding, the keys and values are computed on the first call and
    kept in the cache."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BTD, context_BSD, mask_B11S, deterministic: bool,
                 decoding: bool = False):
        c = self.config
        query, key, value = _projections(c, ("query", "key", "value"))
        if decoding and self.has_variable("cache", "cached_key"):
            k_BSHK, v_BSHK = (self.get_variable("cache", "cached_key"),
                              self.get_variable("cache", "cached_value"))
        else:
            k_BSHK, v_BSHK = key(context_BSD), value(context_BSD)
            if decoding:
                self.put_variable("cache", "cached_key", k_BSHK)
                self.put_variable("cache", "cached_value", v_BSHK)
        return _output(c, multi_head_attention(c, query(x_BTD), k_BSHK, v_BSHK, mask_B11S,
                                               deterministic))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention, feed-forward; each with residual and
    LayerNorm, as BERT's layers (post-LN, or pre-LN)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BTD, mask_B1TT, context_BSD, context_mask_B11S, deterministic: bool,
                 decode_at=None, cache_length: int = 0, cross=None):
        """`context_BSD` None: no cross-attention (a tied stack running as the encoder).
        `cross`: the (CrossAttention, LayerNorm) of a tied decoder, which owns them."""
        c = self.config
        dropout = make_dropout(c.hidden_dropout_prob, c.dropout_mask_bits)
        attention = CausalSelfAttention(c, name="attention")
        x_BTD = residual(c, x_BTD, _layer_norm(c, "attention_layer_norm"),
                         lambda h: attention(h, mask_B1TT, deterministic, decode_at,
                                             cache_length), dropout, deterministic)
        if context_BSD is not None:
            attend, norm = cross or (CrossAttention(c, name="crossattention"),
                                     _layer_norm(c, "crossattention_layer_norm"))
            x_BTD = residual(c, x_BTD, norm,
                             lambda h: attend(h, context_BSD, context_mask_B11S, deterministic,
                                              decode_at is not None), dropout, deterministic)
        return residual(c, x_BTD, _layer_norm(c, "output_layer_norm"),
                        lambda h: feed_forward(c, h), dropout, deterministic)


class DecoderLayers(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x_BTD, mask_B1TT, context_BSD, context_mask_B11S, deterministic: bool,
                 decode_at=None, cache_length: int = 0, cross_blocks=None):
        c = self.config
        for i in range(c.num_hidden_layers):
            cross = None if cross_blocks is None else cross_blocks[i].modules()
            x_BTD = DecoderLayer(c, name=f"layer_{i}")(x_BTD, mask_B1TT, context_BSD,
                                                        context_mask_B11S, deterministic,
                                                        decode_at, cache_length, cross)
        if c.pre_layer_norm:
            x_BTD = _layer_norm(c, "final_layer_norm")(x_BTD)
        return x_BTD


class DecoderModel(nn.Module):
    """The decoder's BERT: embeddings (segment 0 throughout) and the decoder layers, under
    the names a BERT encoder's parameters have (`embeddings`, `encoder/layer_i`)."""

    config: BertConfig

    def setup(self):
        self.embeddings = Embeddings(self.config)
        self.encoder = DecoderLayers(self.config)

    def __call__(self, ids_BT, mask_BT, context_BSD, context_mask_BS, deterministic: bool,
                 decode_at=None, cache_length: int = 0, cross_blocks=None):
        x_BTD = self.embeddings(ids_BT, jnp.zeros_like(ids_BT), deterministic,
                                first_position=0 if decode_at is None else decode_at)
        mask_B1TT = None if decode_at is not None else causal_mask(mask_BT)
        context_mask_B11S = context_mask_BS.astype(bool)[:, None, None, :]
        return self.encoder(x_BTD, mask_B1TT, context_BSD, context_mask_B11S, deterministic,
                            decode_at, cache_length, cross_blocks)

    def attend(self, x_BTD):
        return self.embeddings.attend(x_BTD)


class TiedStack(DecoderModel):
    """tie_encoder_decoder: one BERT (BertModel's parameter names, pooler included) that runs
    as the encoder and, with causal self-attention and the decoder's cross-attention blocks,
    as the decoder."""

    def setup(self):
        super().setup()
        self.pooler = _dense(self.config, self.config.hidden_size, ("embed", "mlp"), "pooler")

    def encode(self, input_ids, input_mask, segment_ids, deterministic: bool):
        x_BSD = self.embeddings(input_ids, segment_ids, deterministic)
        mask_B11S = input_mask.astype(bool)[:, None, None, :]
        x_BSD = self.encoder(x_BSD, mask_B11S, None, None, deterministic)
        # Unused by generation; computed so the pooler's parameters exist, as in BertModel.
        return x_BSD, jnp.tanh(self.pooler(x_BSD[:, 0]))


class CrossBlock(nn.Module):
    """A tied decoder layer's own parameters: its cross-attention and that LayerNorm."""

    config: BertConfig

    def setup(self):
        self.crossattention = CrossAttention(self.config)
        self.crossattention_layer_norm = _layer_norm(self.config, "crossattention_layer_norm")

    def modules(self):
        return self.crossattention, self.crossattention_layer_norm


class _CrossBlocks(nn.Module):
    """Places the blocks at `encoder/layer_i`, where an untied decoder has them."""

    config: BertConfig

    def setup(self):
        self.layer = [CrossBlock(self.config) for _ in range(self.config.num_hidden_layers)]


class _TiedDecoderBert(nn.Module):
    config: BertConfig

    def setup(self):
        self.encoder = _CrossBlocks(self.config)


class TiedDecoder(nn.Module):
    """The decoder of a tied Bert2Bert: runs the shared `stack`; owns only the cross-attention
    blocks (`bert/encoder/layer_i/crossattention*`) and the LM head (`mlm`, tied to the shared
    word embeddings)."""

    config: BertConfig
    stack: TiedStack

    def setup(self):
        self.bert = _TiedDecoderBert(self.config)
        self.mlm = MaskedLMHead(self.config)

    def __call__(self, ids_BT, mask_BT, context_BSD, context_mask_BS, deterministic: bool,
                 decode_at=None, cache_length: int = 0):
        x_BTD = self.stack(ids_BT, mask_BT, context_BSD, context_mask_BS, deterministic,
                           decode_at, cache_length, self.bert.encoder.layer)
        return self.mlm(x_BTD, self.stack.attend).astype(jnp.float32)


def is_tied(params) -> bool:
    """Whether Bert2Bert parameters (or their metadata) are those of a tied model."""
    return "embeddings" not in params["decoder"]["bert"]


class Bert2Bert(nn.Module):
    """The encoder (`bert`, a `BertModel`) and the decoder (`decoder/bert`, `decoder/mlm`).

    `__call__` is teacher forcing: [B, T, V] float32 logits of the token after each decoder
    input. `encode` and `decode` are the two halves, for generation.

    `tie_encoder_decoder` (transformers' option of that name): the decoder runs the encoder's
    embeddings and layers; only its cross-attention and LM head are its own, so the
    parameters are the untied model's less `decoder/bert/embeddings` and the decoder layers'
    self-attention and feed-forward.
    """

    config: BertConfig
    tie_encoder_decoder: bool = False
    num_inputs = 5  # what heads.init_params passes: the encoder's three, the decoder's two

    def setup(self):
        if self.tie_encoder_decoder:
            self.bert = TiedStack(self.config)
            self.decoder = TiedDecoder(self.config, self.bert)
        else:
            self.bert = BertModel(self.config)
            self.decoder = BertDecoder(self.config)

    def encode(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
        if self.tie_encoder_decoder:
            return self.bert.encode(input_ids, input_mask, segment_ids, deterministic)[0]
        return self.bert(input_ids, input_mask, segment_ids, deterministic)[0]

    def decode(self, decoder_input_ids, decoder_input_mask, encoded_BSD, input_mask,
               deterministic: bool = True, decode_at=None, cache_length: int = 0):
        return self.decoder(decoder_input_ids, decoder_input_mask, encoded_BSD, input_mask,
                            deterministic, decode_at, cache_length)

    def __call__(self, input_ids, input_mask, segment_ids, decoder_input_ids,
                 decoder_input_mask, deterministic: bool = True):
        encoded_BSD = self.encode(input_ids, input_mask, segment_ids, deterministic)
        return self.decode(decoder_input_ids, decoder_input_mask, encoded_BSD, input_mask,
                           deterministic)


class BertDecoder(nn.Module):
    """transformers' BertLMHeadModel as a decoder: `bert` and the tied LM head `mlm`."""

    config: BertConfig

    def setup(self):
        self.bert = DecoderModel(self.config)
        self.mlm = MaskedLMHead(self.config)

    def __call__(self, ids_BT, mask_BT, context_BSD, context_mask_BS, deterministic: bool,
                 decode_at=None, cache_length: int = 0):
        x_BTD = self.bert(ids_BT, mask_BT, context_BSD, context_mask_BS, deterministic,
                          decode_at, cache_length)
        return self.mlm(x_BTD, self.bert.attend).astype(jnp.float32)


class UniLM(nn.Module):
    """One BERT stack over `[CLS] source [SEP] target [SEP]` (source segment 0, target
    segment 1) under the seq2seq mask, with the MLM head at the gathered (masked target)
    positions: [B, P, V] float32 logits. Trained by masking target tokens; decoding appends
    a [MASK] after the target so far and predicts it."""

    config: BertConfig
    num_inputs = 4  # heads.init_params: the three inputs and masked_lm_positions

    def setup(self):
        self.bert = BertModel(self.config)
        self.mlm = MaskedLMHead(self.config)

    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
                 deterministic: bool = True):
        x_BPD, _ = self.bert(input_ids, input_mask, segment_ids, deterministic,
                             attention_mask=seq2seq_mask(input_mask, segment_ids),
                             output_positions=masked_lm_positions)
        return self.mlm(x_BPD, self.bert.attend).astype(jnp.float32)
