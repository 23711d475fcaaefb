"""Hugging Face BERT directories (`config.json`, `model.safetensors` or `pytorch_model.bin`).

Reads `BertModel`, `BertForPreTraining` and `BertForMaskedLM` exports: keys with or without
the `bert.` prefix, old `gamma`/`beta` LayerNorm names, with or without the `cls.*` heads,
and with task heads bertjax does not convert (`classifier.*`, `cls.<task>.*`), which are
skipped and listed unless `strict`.
Writes what `transformers.BertForPreTraining.from_pretrained` loads.

An `EncoderDecoderModel` of two BERTs of one architecture (model_type `encoder-decoder`)
reads as a `seq2seq.Bert2Bert`, and a Bert2Bert's params write as one.
"""

from __future__ import annotations

import contextlib
import os
import re

import numpy as np

from bertjax import files
from bertjax.convert import table
from bertjax.convert.params import Log, read_params, write_tensors
from bertjax.convert.result import Converted, CopiedTokenizer, output_directory, tokenizer_files
from bertjax.models.bert import BertConfig
from bertjax.models.seq2seq import Bert2Bert, is_tied

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"

# Hugging Face activation names that bertjax spells differently.
_ACT_FROM_HF = {"gelu_pytorch_tanh": "gelu_tanh"}
_ACT_TO_HF = {"gelu_tanh": "gelu_new"}


def config_from_hf(hf: dict, path: str) -> BertConfig:
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"{path}: model_type {model_type!r}; only BERT ('bert') is supported")
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(f"{path}: position_embedding_type {position_type!r}; bertjax has "
                         f"absolute position embeddings only")
    act = hf.get("hidden_act", "gelu")
    try:
        return BertConfig.from_dict({**hf, "hidden_act": _ACT_FROM_HF.get(act, act)})
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def config_to_hf(config: BertConfig, architecture: str, pad_token_id: int | None) -> dict:
    values = config.to_dict()
    del values["pre_layer_norm"]  # always False here: check_convertible ran
    values["hidden_act"] = _ACT_TO_HF.get(config.hidden_act, config.hidden_act)
    hf = {"architectures": [architecture], "model_type": "bert",
          "position_embedding_type": "absolute", **values}
    if pad_token_id is not None:
        hf["pad_token_id"] = pad_token_id
    return hf


def encoder_decoder_config_to_hf(config: BertConfig, pad_token_id: int | None,
                                 tied: bool = False) -> dict:
    """What `transformers.EncoderDecoderModel.from_pretrained` reads for a Bert2Bert."""
    decoder = {**config_to_hf(config, "BertLMHeadModel", pad_token_id), "is_decoder": True,
               "add_cross_attention": True}
    hf = {"architectures": ["EncoderDecoderModel"], "model_type": "encoder-decoder",
          "is_encoder_decoder": True, "encoder": config_to_hf(config, "BertModel", pad_token_id),
          "decoder": decoder, "tie_encoder_decoder": tied}
    if pad_token_id is not None:
        hf["pad_token_id"] = pad_token_id
    return hf


def _normalise(key: str) -> str:
    """The key as `BertForPreTraining` spells it now: `bert.` prefix, LayerNorm weight/bias."""
    if not key.startswith(("bert.", "cls.")):
        key = "bert." + key
    return _normalise_norms(key)


def _normalise_norms(key: str) -> str:
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                  re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))


class HFSource:
    """The tensors of a Hugging Face checkpoint under normalised names, loaded on demand from
    files that stay open until `opened` closes."""

    def __init__(self, directory: str, opened: contextlib.ExitStack, normalise=_normalise):
        self.path, self._load, self._shape, keys = _open(directory, opened)
        self._raw: dict[str, str] = {}
        for key in keys:
            name = normalise(key)
            if name in self._raw:
                raise ValueError(f"{self.path}: {key!r} and {self._raw[name]!r} are the same "
                                 f"tensor ({name})")
            self._raw[name] = key

    def names(self) -> list[str]:
        return list(self._raw)

    def shape(self, name: str) -> tuple:
        return tuple(self._shape(self._raw[name]))

    def get(self, name: str) -> np.ndarray:
        return self._load(self._raw[name])

    def label(self, name: str) -> str:
        return self._raw.get(name, name)

    def pop(self, name: str) -> None:
        del self._raw[name]

    def rename(self, name: str, new_name: str) -> None:
        self._raw[new_name] = self._raw.pop(name)


def _safe_open(path: str, opened: contextlib.ExitStack):
    from safetensors import safe_open
    local = opened.enter_context(files.local_copy(path))
    try:
        return safe_open(local, "np")
    except Exception as e:  # noqa: BLE001 - safetensors' own error type for bad files
        raise ValueError(f"{path} is not a readable safetensors file ({e}); it may be "
                         f"truncated or damaged") from None


def _open(directory: str, opened: contextlib.ExitStack):
    """(path, load(key), shape(key), keys) of the weights file(s) in `directory`. Both
    libraries map files by name: a remote file is read from a local copy (`files.local_copy`)
    that `opened` removes."""
    directory = files.path(directory)
    path = str(directory / SAFETENSORS)
    if files.path(path).is_file():
        handle = _safe_open(path, opened)
        return (path, handle.get_tensor, lambda k: handle.get_slice(k).get_shape(),
                list(handle.keys()))
    path = str(directory / SAFETENSORS_INDEX)
    if files.path(path).is_file():
        weight_map = files.read_json(path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{path}: no 'weight_map' object")
        handles = {f: _safe_open(str(directory / f), opened)
                   for f in sorted(set(weight_map.values()))}
        return (path, lambda k: handles[weight_map[k]].get_tensor(k),
                lambda k: handles[weight_map[k]].get_slice(k).get_shape(), list(weight_map))
    path = str(directory / TORCH_BIN)
    if files.path(path).is_file():
        try:
            import torch
        except ImportError:
            raise ImportError(f"{path}: reading pytorch_model.bin needs PyTorch, which is not "
                              f"installed; install torch, or save the model as "
                              f"{SAFETENSORS}") from None
        # mmap: tensors are paged in one at a time as they are converted.
        state = torch.load(opened.enter_context(files.local_copy(path)), map_location="cpu",
                           weights_only=True, mmap=True)
        return (path, lambda k: state[k].to(torch.float32).numpy(), lambda k: state[k].shape,
                list(state))
    raise FileNotFoundError(f"{directory}: no {SAFETENSORS}, {SAFETENSORS_INDEX} or "
                            f"{TORCH_BIN} (a Hugging Face BERT directory holds one of them)")


def _resolve_tied(source: HFSource, log: Log, decoder_weight: str = table.HF_DECODER_WEIGHT,
                  decoder_bias: str = table.HF_DECODER_BIAS,
                  word_embeddings: str = table.HF_WORD_EMBEDDINGS,
                  mlm_bias: str = table.HF_MLM_BIAS) -> None:
    """Drops the tensors the model derives from others (the position-id buffers, the LM
    decoder tied to the word embeddings), after checking they are."""
    ignored = []
    for name in [n for n in source.names() if n.endswith("embeddings.position_ids")]:
        source.pop(name)
        ignored.append(f"{name} (a buffer)")
    names = source.names()
    if decoder_bias in names and mlm_bias not in names:
        source.rename(decoder_bias, mlm_bias)
    for tied, to in ((decoder_weight, word_embeddings), (decoder_bias, mlm_bias)):
        if tied not in source.names():
            continue
        if (to not in source.names() or source.shape(tied) != source.shape(to)
                or not np.array_equal(source.get(tied), source.get(to))):
            raise ValueError(f"{source.path}: {source.label(tied)} is not tied to "
                             f"{source.label(to)}; bertjax's MLM decoder is the word "
                             f"embeddings and cannot hold a separate one")
        source.pop(tied)
        ignored.append(f"{tied} (tied to {to})")
    if ignored:
        log(f"ignoring {', '.join(ignored)}")


def _encoder_decoder_config(hf: dict, path: str) -> BertConfig:
    for part in ("encoder", "decoder"):
        if not isinstance(hf.get(part), dict):
            raise ValueError(f"{path}: an encoder-decoder config without its {part!r} config")
    encoder = config_from_hf(hf["encoder"], f"{path} (encoder)")
    decoder = config_from_hf(hf["decoder"], f"{path} (decoder)")
    if not hf["decoder"].get("add_cross_attention", False):
        raise ValueError(f"{path}: the decoder has no cross-attention (add_cross_attention)")
    if encoder != decoder:
        differ = [k for k in BertConfig.ARCHITECTURE_KEYS
                  if getattr(encoder, k) != getattr(decoder, k)]
        raise ValueError(f"{path}: encoder and decoder differ in {', '.join(differ)}; bertjax's "
                         f"Bert2Bert has one architecture for both")
    return encoder


def _read_encoder_decoder(directory: str, hf: dict, config_path: str, seed: int, log: Log,
                          strict: bool, opened: contextlib.ExitStack) -> Converted:
    config = _encoder_decoder_config(hf, config_path)
    tied = bool(hf.get("tie_encoder_decoder", False))
    source = HFSource(directory, opened, _normalise_norms)
    if tied:
        _drop_shared(source, config.num_hidden_layers, log)
    words = (table.HF_WORD_EMBEDDINGS.replace("bert.", "encoder.", 1) if tied
             else table.ED_WORD_EMBEDDINGS)
    _resolve_tied(source, log, table.ED_DECODER_WEIGHT, table.ED_DECODER_BIAS, words,
                  table.ED_MLM_BIAS)
    params, fresh, skipped = read_params(
        config, source, "hf", seed, log, strict,
        model=Bert2Bert(config, tie_encoder_decoder=tied),
        rows=table.encoder_decoder(config.num_hidden_layers, tied),
        encoder_prefixes=table.ED_PREFIXES)
    return Converted(config, params, fresh, tokenizer_files(directory), skipped)


def _drop_shared(source: HFSource, num_hidden_layers: int, log: Log) -> None:
    """tie_encoder_decoder: the decoder tensors that are the encoder's are dropped after
    checking they are. transformers saves one name of each tied group, which may be the
    decoder's: then it is the encoder's tensor, renamed."""
    dropped = 0
    for name, encoder_name in table.ed_shared_names(num_hidden_layers).items():
        if name not in source.names():
            continue
        if encoder_name not in source.names():
            source.rename(name, encoder_name)
            continue
        if not np.array_equal(source.get(name), source.get(encoder_name)):
            raise ValueError(f"{source.path}: {source.label(name)} is not the encoder's "
                             f"{encoder_name}, though the config ties encoder and decoder")
        source.pop(name)
        dropped += 1
    if dropped:
        log(f"ignoring {dropped} decoder tensors tied to the encoder's")


def read_hf(directory: str, seed: int = 0, log: Log = print, strict: bool = False) -> Converted:
    config_path = str(files.path(directory) / "config.json")
    hf = files.read_json(config_path)
    with contextlib.ExitStack() as opened:
        if hf.get("model_type") == "encoder-decoder":
            return _read_encoder_decoder(directory, hf, config_path, seed, log, strict, opened)
        config = config_from_hf(hf, config_path)
        source = HFSource(directory, opened)
        _resolve_tied(source, log)
        params, fresh, skipped = read_params(config, source, "hf", seed, log, strict)
    return Converted(config, params, fresh, tokenizer_files(directory), skipped)


def _pad_id(tokenizer_paths: list[str]) -> int | None:
    vocab = [p for p in tokenizer_paths if files.path(p).name == "vocab.txt"]
    if not vocab:
        return None
    tokens = files.read_text(vocab[0]).split("\n")
    return tokens.index("[PAD]") if "[PAD]" in tokens else None


def write_hf(directory: str, converted: Converted, overwrite: bool = False,
             log: Log = print) -> str:
    from safetensors.numpy import save_file

    config = converted.config
    pad_id = _pad_id(converted.tokenizer_files)
    if "decoder" in converted.params:
        tied = is_tied(converted.params)
        layers = config.num_hidden_layers
        tensors = dict(write_tensors(config, converted.params, "hf", log,
                                     model=Bert2Bert(config, tie_encoder_decoder=tied),
                                     rows=table.encoder_decoder(layers, tied)))
        if tied:  # written out although tied, as transformers' own state dict has them
            tensors.update({name: tensors[encoder_name] for name, encoder_name
                            in table.ed_shared_names(layers).items()})
        tensors[table.ED_DECODER_WEIGHT] = tensors[table.ED_WORD_EMBEDDINGS]
        tensors[table.ED_DECODER_BIAS] = tensors[table.ED_MLM_BIAS]
        hf_config = encoder_decoder_config_to_hf(config, pad_id, tied)
    else:
        tensors = dict(write_tensors(config, converted.params, "hf", log))
        heads = table.HF_MLM_BIAS in tensors and "cls.seq_relationship.weight" in tensors
        if table.HF_MLM_BIAS in tensors:
            # Written out although tied: readers other than transformers expect the decoder.
            tensors[table.HF_DECODER_WEIGHT] = tensors[table.HF_WORD_EMBEDDINGS]
            tensors[table.HF_DECODER_BIAS] = tensors[table.HF_MLM_BIAS]
        hf_config = config_to_hf(config, "BertForPreTraining" if heads else "BertModel", pad_id)
    with output_directory(directory, overwrite, marker="config.json") as stage:
        log(f"writing {len(tensors)} tensors to {files.path(directory) / SAFETENSORS}")
        save_file(tensors, os.path.join(stage, SAFETENSORS), metadata={"format": "pt"})
        os.chmod(os.path.join(stage, SAFETENSORS), 0o644)  # safetensors creates it owner-only
        files.write_json(os.path.join(stage, "config.json"), hf_config, indent=2,
                         sort_keys=True)
        CopiedTokenizer(converted.tokenizer_files).save(stage)
    return str(files.path(directory))

