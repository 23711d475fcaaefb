"""Predictions from trained models, on this process's first device: fill-mask from a
pretrained model, and each task's predictions from a fine-tuned one (what
`python -m bertjax.predict` runs)."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from bertjax import files
from bertjax.data.tokenizers import load_tokenizer
from bertjax.models.heads import BertForPreTraining, param_shapes
from bertjax.tasks import base as tasks
from bertjax.training import checkpoints
from bertjax.training.trainer import batched_outputs

MASK = "[MASK]"


def encode_masked(tokenizer, text: str, max_length: int) -> tuple[list[int], list[int]]:
    """[CLS] text [SEP] with every literal [MASK] as the mask token; (ids, mask positions)."""
    pieces = text.split(MASK)
    if len(pieces) < 2:
        raise ValueError(f"--text {text!r} has no {MASK} to fill")
    ids = [tokenizer.cls_id]
    positions = []
    for i, piece in enumerate(pieces):
        if i:
            positions.append(len(ids))
            ids.append(tokenizer.mask_id)
        ids += tokenizer.encode(piece) if piece.strip() else []
    ids.append(tokenizer.sep_id)
    if len(ids) > max_length:
        raise ValueError(f"--text {text[:40]!r}... is {len(ids)} tokens with [CLS] and [SEP]; "
                         f"the model takes at most {max_length}")
    return ids, positions


def fill_mask(model: str, texts: list[str], top_k: int) -> list[list[list[tuple[str, float]]]]:
    """For each text, for each [MASK]: the top_k (token, probability) pairs. `model` is
    anything `checkpoints.open_model` reads."""
    source = checkpoints.open_model(model)
    if source.model_dir is not None and (files.path(source.model_dir)
                                         / tasks.TASK_FILE).exists():
        raise ValueError(f"{model} is a fine-tuned task model, which has no masked-LM head; "
                         f"fill-mask needs a pretrained model")
    config = source.config
    module = BertForPreTraining(config)
    params = source.load_params(checkpoints.on_first_device(param_shapes(module)))
    tokenizer = load_tokenizer(source.tokenizer_dir)
    apply = jax.jit(lambda p, *args: module.apply({"params": p}, *args, deterministic=True))
    results = []
    for text in texts:
        ids, positions = encode_masked(tokenizer, text, config.max_position_embeddings)
        ids_BL = np.asarray([ids], np.int32)
        out = apply(params, ids_BL, np.ones_like(ids_BL), np.zeros_like(ids_BL),
                    np.asarray([positions], np.int32))
        probs_PV = np.asarray(jax.nn.softmax(out["mlm_logits"][0], axis=-1))
        results.append([
            [(tokenizer.decode([int(t)]).strip() or tokenizer.id_to_token(int(t)),
              float(probs_V[t])) for t in np.argsort(-probs_V)[:top_k]]
            for probs_V in probs_PV])
    return results


# Prediction cuts its batches to these lengths (below the model's max_seq_length), rows
# sorted by length first, for every task whose batches may be cut: a file of short texts
# costs what its texts need, in a few compiled shapes. The outputs are the padded ones.
PREDICTION_BUCKETS = (16, 32, 64, 128, 256)


class TaskPredictor:
    """A fine-tuned model directory (or the workdir that exported it) and its task."""

    def __init__(self, model: str, batch_size: int = 32, command: str | None = None,
                 bucket_lengths: Sequence[int] = PREDICTION_BUCKETS):
        """`command`: the predict command asked for; a model of another task is refused
        before its parameters are read. `bucket_lengths`: () pads every batch to the task's
        max_seq_length."""
        source = checkpoints.open_model(model)
        if source.model_dir is None:
            raise ValueError(f"{model} is a pretraining run, not a fine-tuned model")
        self.task, self.labels = tasks.Task.from_model_directory(source.model_dir)
        if command is not None and self.task.command != command:
            raise ValueError(f"{model} is a {self.task.name} model: use "
                             f"`python -m bertjax.predict {self.task.command}`")
        module = self.task.model(source.config, self.labels)
        self.params = source.load_params(checkpoints.on_first_device(param_shapes(module)))
        self.tokenizer = load_tokenizer(source.tokenizer_dir)
        self._apply = jax.jit(lambda p, batch: self.task.infer(module, p, batch))
        self.batch_size = batch_size
        self.bucket_lengths = () if self.task.no_bucketing_because else tuple(bucket_lengths)

    def predict(self, examples: Sequence) -> list[dict]:
        """One record per example (of the task's example type)."""
        features = self.task.featurize(list(examples), self.tokenizer, self.labels)
        length = features.arrays["input_ids"].shape[1]
        outputs = batched_outputs(self._apply, self.params, features.arrays, tasks.INPUTS,
                                  self.batch_size,
                                  bucket_lengths=[b for b in self.bucket_lengths if b < length])
        taskset = tasks.TaskSet("predict", list(examples), features, labelled=False)
        return self.task.evaluate(taskset, outputs, self.labels)[1]

    def examples_from_file(self, path: str, text_columns: Sequence[str] = ("sentence",),
                           fmt: str = "") -> list:
        """A file laid out like the training data, without labels: TSV/CSV/JSONL with the
        text columns, a CoNLL file (tags ignored), SQuAD JSON."""
        settings = self.task.settings.copy_and_resolve_references()
        settings.format = fmt or None
        if "text_columns" in settings:  # the tasks that read tables
            settings.text_columns = tuple(text_columns)
        reader = type(self.task)(settings)
        return reader.read(path, labelled=False)
