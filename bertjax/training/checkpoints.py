"""Checkpoints on disk (the only file that imports Orbax).

A *model directory* is what conversion writes and what pretraining (`init_checkpoint`) and
fine-tuning start from:

  DIR/config.json   the model config, in original `bert_config.json` key names
  DIR/params/       the parameter pytree, an Orbax checkpoint
  DIR/vocab.txt or DIR/spm.model   the tokenizer

It is written into a temporary sibling and renamed into place, so a crash never leaves a
half-written directory behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import jax
import orbax.checkpoint as ocp

from bertjax.models.bert import BertConfig

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"


def _flat_shapes(tree) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
            for path, leaf in flat}


def check_same_shapes(expected, found, where: str) -> None:
    """Raises a clear error naming the first tensors whose names or shapes differ."""
    want, have = _flat_shapes(expected), _flat_shapes(found)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    wrong = [f"{k}: checkpoint {have[k]}, model {want[k]}"
             for k in sorted(set(want) & set(have)) if want[k] != have[k]]
    problems = ([f"missing {k}" for k in missing[:5]] + [f"unexpected {k}" for k in extra[:5]]
                + wrong[:5])
    if problems:
        raise ValueError(f"{where} does not match the model (another model size or "
                         f"architecture?): " + "; ".join(problems))


def save_params(path: str, params: Any) -> None:
    """Saves a parameter pytree (plain arrays) as an Orbax checkpoint at `path`."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.abspath(path), params, force=True)


def restore_params(path: str, abstract_params: Any | None = None) -> Any:
    """Restores parameters; with `abstract_params` (ShapeDtypeStructs, optionally sharded)
    they are checked against it and placed as it says."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no parameter checkpoint there")
    with ocp.StandardCheckpointer() as checkpointer:
        if abstract_params is not None:
            stored = checkpointer.metadata(path).item_metadata
            check_same_shapes(abstract_params, stored, path)
        return checkpointer.restore(path, abstract_params)


def save_model(directory: str, params: Any, config: BertConfig, tokenizer=None,
               overwrite: bool = False) -> str:
    """Writes a model directory atomically; `tokenizer` (a bertjax Tokenizer) is optional."""
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not overwrite:
        raise FileExistsError(f"{directory} already exists (pass overwrite to replace it)")
    tmp = f"{directory}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump({"model_type": "bert", **config.to_dict()}, f, indent=2, sort_keys=True)
        save_params(os.path.join(tmp, PARAMS_DIR), params)
        if tokenizer is not None:
            tokenizer.save(tmp)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_model_config(directory: str, **overrides) -> BertConfig:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: {directory!r} is not a bertjax model directory")
    with open(path) as f:
        return BertConfig.from_dict(json.load(f), **overrides)


def load_model(directory: str, abstract_params: Any | None = None, **config_overrides):
    """(config, params) of a model directory."""
    config = load_model_config(directory, **config_overrides)
    return config, restore_params(os.path.join(directory, PARAMS_DIR), abstract_params)
