"""Predictions from a fine-tuned model directory (WORKDIR/model of a fine-tuning run):
classification label and probability, regression score, a tag per word, or an answer span.

The directory holds the model (config.json, params/, tokenizer) plus `task.json` (the task
type and the feature settings it was trained with) and `labels.json` (its label vocabulary).
"""

from __future__ import annotations

import json
import os
import types
from typing import Sequence

import jax
import numpy as np

from bertjax.data import conll, squad, tasks
from bertjax.data.features import LabelVocab
from bertjax.data.tokenizers import load_tokenizer
from bertjax.training import checkpoints, task_inputs, task_types

TASK_FILE = "task.json"


def is_task_model(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, TASK_FILE))


class TaskPredictor:
    def __init__(self, directory: str, batch_size: int = 32):
        path = os.path.join(directory, TASK_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: {directory} is not a fine-tuned model "
                                    f"(fine-tuning exports one as WORKDIR/model)")
        with open(path) as f:
            self.task = types.SimpleNamespace(**json.load(f))
        self.kind = task_types.task_type(self.task.type)
        self.labels = (LabelVocab.load(directory)
                       if self.task.type in ("classification", "tagging") else None)
        config, self.params = checkpoints.load_model(directory)
        self.tokenizer = load_tokenizer(directory)
        model = self.kind.model(config, self.labels)
        self._apply = jax.jit(lambda p, ids, mask, seg: self.kind.fetch(
            model.apply({"params": p}, ids, mask, seg, deterministic=True)))
        self.batch_size = batch_size

    def predict(self, examples: Sequence) -> list[dict]:
        """One record per example (TextExample, TaggedSentence or SquadExample by task)."""
        features = task_inputs.featurize(self.task, list(examples), self.tokenizer, self.labels)
        arrays = features.arrays
        n = len(features)
        outputs = []
        for start in range(0, n, self.batch_size):
            rows = np.arange(start, start + self.batch_size) % n  # the last batch wraps round
            outputs.append(jax.device_get(self._apply(
                self.params, *(arrays[k][rows] for k in task_types.INPUTS))))
        outputs = jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *outputs)
        taskset = task_inputs.TaskSet("predict", list(examples), features, labelled=False)
        return self.kind.evaluate(self.task, taskset, outputs, self.labels)[1]

    def examples_from_texts(self, texts: Sequence[str], context: str = "") -> list:
        """`--text` inputs: a sentence (a TAB separates a pair), words to tag, or a question
        about `context`."""
        if self.task.type == "squad":
            if not context:
                raise ValueError("a question-answering model needs a context to answer from")
            return [squad.SquadExample(f"text{i}", t, context, []) for i, t in enumerate(texts)]
        if self.task.type == "tagging":
            return [conll.TaggedSentence(f"text{i}", conll.words_of(t))
                    for i, t in enumerate(texts)]
        examples = []
        for i, text in enumerate(texts):
            a, _, b = text.partition("\t")
            examples.append(tasks.TextExample(f"text{i}", a, b if b else None))
        return examples

    def examples_from_file(self, path: str, text_columns: str = "", header: bool = True,
                           fmt: str = "") -> list:
        """A file like the training data, without labels needed: a TSV/CSV/JSONL with the
        text columns, a CoNLL file (tags ignored), or SQuAD JSON."""
        spec = types.SimpleNamespace(**vars(self.task))
        spec.format = fmt
        spec.header = header
        spec.text_columns = text_columns or "sentence"
        spec.tag_scheme, spec.strict_tags = "", False
        return task_inputs.read_examples(spec, path, labelled=False)
