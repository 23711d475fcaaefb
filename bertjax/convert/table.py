"""The rename table between bertjax parameter paths and original TF / Hugging Face tensor names.

Every tensor of `BertForPreTraining` has one row: its bertjax path, its name in the original
Google release (TF), its name in a Hugging Face `BertForPreTraining` state dict, and a layout
kind saying how the arrays differ. `encoder_decoder` derives the table of
`seq2seq.Bert2Bert` (a Hugging Face `EncoderDecoderModel` of two BERTs) from it: the encoder
rows under `encoder.`, the decoder's under `decoder.bert.` / `decoder.cls.`, plus each decoder
layer's cross-attention, which is named like its self-attention.

  the original TF layout is the reference: dense kernels are [in, out];
  Hugging Face stores dense kernels as torch Linear weights, [out, in];
  bertjax keeps attention projections per head, [D, D] <-> [D, H, K] (query/key/value) and
  [D, D] <-> [H, K, D] (attention output), biases [D] <-> [H, K];
  the NSP kernel is [D, 2] here and [2, D] (`output_weights`) in both TF and HF.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np


class Kind(enum.Enum):
    PLAIN = "plain"  # same array in all three formats (embeddings, biases, LayerNorm)
    KERNEL = "kernel"  # [in, out]; transposed in HF
    HEADS_IN = "heads_in"  # query/key/value kernel: [D, H*K] -> [D, H, K]; transposed in HF
    HEADS_BIAS = "heads_bias"  # query/key/value bias: [H*K] -> [H, K]
    HEADS_OUT = "heads_out"  # attention output kernel: [H*K, D] -> [H, K, D]; transposed in HF
    NSP = "nsp"  # [2, D] in TF and HF, [D, 2] here


_TRANSPOSED_IN_HF = (Kind.KERNEL, Kind.HEADS_IN, Kind.HEADS_OUT)

# Tensors Hugging Face keeps besides the table's (and besides the position-id buffers): the
# MLM decoder's weight and bias, which are the word embeddings and `cls.predictions.bias`
# again (tied).
HF_DECODER_WEIGHT = "cls.predictions.decoder.weight"
HF_DECODER_BIAS = "cls.predictions.decoder.bias"
HF_WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
HF_MLM_BIAS = "cls.predictions.bias"

# Original-release variables that are not model weights: the step counter and the optimizer
# slots that `run_pretraining.py` checkpoints carry next to each weight.
TF_IGNORED_NAMES = ("global_step",)
TF_IGNORED_SUFFIXES = ("/adam_m", "/adam_v")

# Where the encoder's tensors live in each format. A tensor there that the table lacks means
# the config does not describe the checkpoint (a layer more, another architecture): always an
# error. Anything else the table lacks is a head bertjax does not have (a task classifier,
# `cls.<task>.*`): skipped unless conversion is strict.
ENCODER_PREFIXES = {"hf": ("bert.embeddings.", "bert.encoder.", "bert.pooler."),
                    "tf": ("bert/embeddings/", "bert/encoder/", "bert/pooler/")}

# Parts a checkpoint may lack (an encoder-only export has no `cls.*`, some have no pooler);
# they are initialised fresh, and reported. A part is all there or all missing.
OPTIONAL_PARTS = ("bert/pooler/", "mlm/", "nsp/")


@dataclasses.dataclass(frozen=True)
class Row:
    ours: str  # bertjax path, '/'-separated, under the params collection
    tf: str
    hf: str
    kind: Kind

    def name(self, fmt: str) -> str:
        return {"tf": self.tf, "hf": self.hf}[fmt]

    def shape(self, fmt: str, ours_shape: tuple) -> tuple:
        """The tensor's shape in format `fmt` ('tf' or 'hf') given its shape here."""
        if self.kind is Kind.NSP:
            return tuple(reversed(ours_shape))
        if self.kind is Kind.HEADS_IN:
            shape = (ours_shape[0], ours_shape[1] * ours_shape[2])
        elif self.kind is Kind.HEADS_OUT:
            shape = (ours_shape[0] * ours_shape[1], ours_shape[2])
        elif self.kind is Kind.HEADS_BIAS:
            shape = (ours_shape[0] * ours_shape[1],)
        else:
            shape = tuple(ours_shape)
        if fmt == "hf" and self.kind in _TRANSPOSED_IN_HF:
            shape = tuple(reversed(shape))
        return shape

    def to_ours(self, x: np.ndarray, fmt: str, ours_shape: tuple) -> np.ndarray:
        if self.kind is Kind.NSP or (fmt == "hf" and self.kind in _TRANSPOSED_IN_HF):
            x = x.T
        return np.ascontiguousarray(x).reshape(ours_shape)

    def from_ours(self, x: np.ndarray, fmt: str) -> np.ndarray:
        x = np.asarray(x)
        shape = self.shape("tf", x.shape)
        if self.kind is Kind.NSP:
            x = x.T
        x = x.reshape(shape)
        if fmt == "hf" and self.kind in _TRANSPOSED_IN_HF:
            x = x.T
        return np.ascontiguousarray(x)


def _dense(ours: str, tf: str, hf: str, kernel_kind=Kind.KERNEL, bias_kind=Kind.PLAIN):
    return [Row(f"{ours}/kernel", f"{tf}/kernel", f"{hf}.weight", kernel_kind),
            Row(f"{ours}/bias", f"{tf}/bias", f"{hf}.bias", bias_kind)]


def _norm(ours: str, tf: str, hf: str):
    return [Row(f"{ours}/scale", f"{tf}/gamma", f"{hf}.weight", Kind.PLAIN),
            Row(f"{ours}/bias", f"{tf}/beta", f"{hf}.bias", Kind.PLAIN)]


def _attention(ours: str, tf: str, hf: str):
    table = []
    for n in ("query", "key", "value"):
        table += _dense(f"{ours}/{n}", f"{tf}/self/{n}", f"{hf}.self.{n}", Kind.HEADS_IN,
                        Kind.HEADS_BIAS)
    return table + _dense(f"{ours}/attention_output", f"{tf}/output/dense",
                          f"{hf}.output.dense", Kind.HEADS_OUT)


def rows(num_hidden_layers: int) -> list[Row]:
    """The table for a post-LN `BertForPreTraining` with this many layers."""
    table = [Row(f"bert/embeddings/{n}/embedding", f"bert/embeddings/{n}",
                 f"bert.embeddings.{n}.weight", Kind.PLAIN)
             for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    table += _norm("bert/embeddings/layer_norm", "bert/embeddings/LayerNorm",
                   "bert.embeddings.LayerNorm")
    for i in range(num_hidden_layers):
        ours = tf = f"bert/encoder/layer_{i}"
        hf = f"bert.encoder.layer.{i}"
        table += _attention(f"{ours}/attention", f"{tf}/attention", f"{hf}.attention")
        table += _norm(f"{ours}/attention_layer_norm", f"{tf}/attention/output/LayerNorm",
                       f"{hf}.attention.output.LayerNorm")
        table += _dense(f"{ours}/intermediate", f"{tf}/intermediate/dense",
                        f"{hf}.intermediate.dense")
        table += _dense(f"{ours}/output", f"{tf}/output/dense", f"{hf}.output.dense")
        table += _norm(f"{ours}/output_layer_norm", f"{tf}/output/LayerNorm",
                       f"{hf}.output.LayerNorm")
    table += _dense("bert/pooler", "bert/pooler/dense", "bert.pooler.dense")
    table += _dense("mlm/transform", "cls/predictions/transform/dense",
                    "cls.predictions.transform.dense")
    table += _norm("mlm/layer_norm", "cls/predictions/transform/LayerNorm",
                   "cls.predictions.transform.LayerNorm")
    table += [Row("mlm/output_bias", "cls/predictions/output_bias", HF_MLM_BIAS, Kind.PLAIN),
              Row("nsp/kernel", "cls/seq_relationship/output_weights",
                  "cls.seq_relationship.weight", Kind.NSP),
              Row("nsp/bias", "cls/seq_relationship/output_bias", "cls.seq_relationship.bias",
                  Kind.PLAIN)]
    return table


# Hugging Face EncoderDecoderModel names. The decoder's LM decoder weight and bias are its
# word embeddings and `cls.predictions.bias` again (tied), and not in the table.
ED_DECODER_WEIGHT = "decoder.cls.predictions.decoder.weight"
ED_DECODER_BIAS = "decoder.cls.predictions.decoder.bias"
ED_WORD_EMBEDDINGS = "decoder.bert.embeddings.word_embeddings.weight"
ED_MLM_BIAS = "decoder.cls.predictions.bias"
ED_PREFIXES = ("encoder.", "decoder.")


def _moved(row: Row, ours: str, tf: str, hf: str) -> Row:
    return Row(ours + row.ours, tf + row.tf, hf + row.hf, row.kind)


def encoder_decoder(num_hidden_layers: int, tied: bool = False) -> list[Row]:
    """The table for `seq2seq.Bert2Bert` <-> a Hugging Face EncoderDecoderModel of two
    BERTs (`encoder` a BertModel, `decoder` a BertLMHeadModel with cross-attention). The TF
    names are the pretraining table's under `encoder/` and `decoder/`. `tied`
    (tie_encoder_decoder): the decoder's embeddings and self-attention and feed-forward
    weights are the encoder's, and have no rows (see `ed_shared_names`)."""
    base = rows(num_hidden_layers)
    table = [Row(r.ours, "encoder/" + r.tf, "encoder" + r.hf[len("bert"):], r.kind)
             for r in base if r.ours.startswith("bert/")]
    shared = () if tied else ("bert/embeddings/", "bert/encoder/")
    table += [_moved(r, "decoder/", "decoder/", "decoder.") for r in base
              if r.ours.startswith((*shared, "mlm/"))]
    for i in range(num_hidden_layers):
        ours, tf = f"decoder/bert/encoder/layer_{i}", f"decoder/bert/encoder/layer_{i}"
        hf = f"decoder.bert.encoder.layer.{i}"
        table += _attention(f"{ours}/crossattention", f"{tf}/crossattention",
                            f"{hf}.crossattention")
        table += _norm(f"{ours}/crossattention_layer_norm", f"{tf}/crossattention/output/LayerNorm",
                       f"{hf}.crossattention.output.LayerNorm")
    return table


def ed_shared_names(num_hidden_layers: int) -> dict[str, str]:
    """Hugging Face name of each tied decoder tensor -> the encoder tensor it is."""
    return {"decoder." + r.hf: "encoder" + r.hf[len("bert"):]
            for r in rows(num_hidden_layers)
            if r.ours.startswith(("bert/embeddings/", "bert/encoder/"))}


def optional_part(ours: str) -> str | None:
    return next((p for p in OPTIONAL_PARTS if ours.startswith(p)), None)
