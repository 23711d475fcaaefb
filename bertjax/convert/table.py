"""The rename table between bertjax parameter paths and original TF / Hugging Face tensor names.

Every tensor of `BertForPreTraining` has one row: its bertjax path, its name in the original
Google release (TF), its name in a Hugging Face `BertForPreTraining` state dict, and a layout
kind saying how the arrays differ:

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

# Tensors Hugging Face keeps besides the table's: a buffer, and the MLM decoder's weight and
# bias, which are the word embeddings and `cls.predictions.bias` again (tied).
HF_POSITION_IDS = "bert.embeddings.position_ids"
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
        for n in ("query", "key", "value"):
            table += _dense(f"{ours}/attention/{n}", f"{tf}/attention/self/{n}",
                            f"{hf}.attention.self.{n}", Kind.HEADS_IN, Kind.HEADS_BIAS)
        table += _dense(f"{ours}/attention/attention_output", f"{tf}/attention/output/dense",
                        f"{hf}.attention.output.dense", Kind.HEADS_OUT)
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


def optional_part(ours: str) -> str | None:
    return next((p for p in OPTIONAL_PARTS if ours.startswith(p)), None)
