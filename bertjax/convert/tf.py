"""Original Google BERT releases: `bert_config.json`, `vocab.txt`, `bert_model.ckpt.*`.

Reads with `tf.train.load_checkpoint` and writes with the same `SaveV2` op `tf.compat.v1`'s
Saver uses, so the variables carry exactly the original names (`bert/encoder/layer_0/...`)
and `run_pretraining.py` / `run_classifier.py` can `init_checkpoint` from the output.
TensorFlow reads gs:// itself, through the same Cloud Storage client as `bertjax.files`.
"""

from __future__ import annotations

import os

import numpy as np

from bertjax import files
from bertjax.convert import table
from bertjax.convert.params import Log, read_params, write_tensors
from bertjax.convert.result import Converted, CopiedTokenizer, output_directory, tokenizer_files
from bertjax.models.bert import BertConfig

CONFIG_FILE = "bert_config.json"
CHECKPOINT_NAME = "bert_model.ckpt"


def _tf():
    from bertjax.data import tensorflow
    return tensorflow()


def find_checkpoint(path: str) -> str:
    """The checkpoint prefix at `path`: a prefix itself, or a directory holding one."""
    if files.path(path + ".index").is_file():
        return path
    if not files.path(path).is_dir():
        raise FileNotFoundError(f"{path}: neither a directory nor a TF checkpoint prefix "
                                f"({path}.index does not exist)")
    preferred = str(files.path(path) / CHECKPOINT_NAME)
    if files.path(preferred + ".index").is_file():
        return preferred
    latest = _tf().train.latest_checkpoint(path)
    if latest:
        return latest
    found = files.glob(str(files.path(path) / "*.index"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"{path}: expected one TF checkpoint ({CHECKPOINT_NAME}.index), found "
            f"{[files.path(f).name for f in found] or 'none'}")
    return found[0][: -len(".index")]


class TFSource:
    """The variables of a TF checkpoint, read one at a time; optimizer slots left out."""

    def __init__(self, prefix: str, log: Log):
        self.path = prefix
        self._reader = _tf().train.load_checkpoint(prefix)
        self._shapes = self._reader.get_variable_to_shape_map()
        ignored = sorted(n for n in self._shapes if n in table.TF_IGNORED_NAMES
                         or n.endswith(table.TF_IGNORED_SUFFIXES))
        if ignored:
            log(f"ignoring {len(ignored)} non-weight variables (step counter, Adam slots)")
        self._names = [n for n in self._shapes if n not in ignored]

    def names(self) -> list[str]:
        return self._names

    def shape(self, name: str) -> tuple:
        return tuple(self._shapes[name])

    def get(self, name: str) -> np.ndarray:
        return self._reader.get_tensor(name)

    def label(self, name: str) -> str:
        return name


def read_tf(path: str, seed: int = 0, log: Log = print, strict: bool = False) -> Converted:
    prefix = find_checkpoint(path)
    directory = path if files.path(path).is_dir() else str(files.path(prefix).parent)
    config_path = str(files.path(directory) / CONFIG_FILE)
    try:
        config = BertConfig.from_dict(files.read_json(config_path))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config_path}: {e}") from None
    params, fresh, skipped = read_params(config, TFSource(prefix, log), "tf", seed, log, strict)
    return Converted(config, params, fresh, tokenizer_files(directory), skipped)


def write_tf(directory: str, converted: Converted, overwrite: bool = False,
             log: Log = print) -> str:
    tf = _tf()
    config = converted.config
    names, tensors = zip(*write_tensors(config, converted.params, "tf", log))
    values = config.to_dict()
    del values["pre_layer_norm"]  # always False here: write_tensors checked it
    with output_directory(directory, overwrite, marker=CONFIG_FILE) as stage:
        log(f"writing {len(names)} variables to {files.path(directory) / CHECKPOINT_NAME}")
        tf.raw_ops.SaveV2(prefix=os.path.join(stage, CHECKPOINT_NAME), tensor_names=list(names),
                          shape_and_slices=[""] * len(names), tensors=list(tensors))
        # The state file `tf.train.latest_checkpoint` looks for; relative, so it moves along.
        files.write_text(os.path.join(stage, "checkpoint"),
                         f'model_checkpoint_path: "{CHECKPOINT_NAME}"\n'
                         f'all_model_checkpoint_paths: "{CHECKPOINT_NAME}"\n')
        files.write_json(os.path.join(stage, CONFIG_FILE), values, indent=2, sort_keys=True)
        CopiedTokenizer(converted.tokenizer_files).save(stage)
    return str(files.path(directory))
