"""Multiple choice (SWAG, HellaSwag, ARC-style questions): a context and N candidate endings,
one of them right. As the BERT paper fine-tuned SWAG, each candidate is one row
`[CLS] context [SEP] question ending [SEP]` scored by a dense layer on its pooled [CLS], and a
softmax over the N scores picks one (transformers' BertForMultipleChoice computes the same).

Files: TSV/CSV/JSONL with a context column, the candidates' columns and the label column (the
right candidate's 0-based index); an optional question column is put before every candidate
(SWAG's `sent2`, the start of the ending). The defaults read SWAG's own CSV files:
`sent1` (the context), `sent2`, `ending0`..`ending3` and `label`.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections.config_dict import placeholder

from bertjax.models.heads import BertForSequenceClassification
from bertjax.tasks import metrics, tables
from bertjax.tasks.base import Task, TaskSet, register
from bertjax.tasks.features import Features, Packer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ChoiceExample:
    guid: str  # where it came from ("train.csv:12"), for messages and prediction files
    context: str
    choices: list[str]  # each with the question (if any) before it
    label: int | None = None  # the right choice's index


class BertForMultipleChoice(BertForSequenceClassification):
    """One score per candidate: [B, C, L] inputs give [B, C] float32 logits. The parameters
    are a one-output sequence classifier's (`bert`, `classifier`), so the encoder loads from
    any checkpoint as the other tasks' does."""

    num_labels: int = 1

    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
        length = input_ids.shape[-1]
        rows = [x.reshape(-1, length) for x in (input_ids, input_mask, segment_ids)]
        return super().__call__(*rows, deterministic).reshape(input_ids.shape[:-1])


@register
class MultipleChoice(Task):
    name = "multiple_choice"
    command = "choose"
    targets = ("label",)
    best_metric = "accuracy"
    higher_is_better = ("accuracy",)
    no_bucketing_because = ("its rows are [choices, length], and cutting is done on a text "
                            "axis that batches of candidates do not have")

    @classmethod
    def own_settings(cls) -> dict:
        return {
            "header": True,  # TSV/CSV files start with a header line of column names
            "context_column": "sent1",
            "question_column": placeholder(str),  # None: no question before the candidates
            "choice_columns": ("ending0", "ending1", "ending2", "ending3"),
            "label_column": "label",
        }

    def __init__(self, settings):
        super().__init__(settings)
        if len(settings.choice_columns) < 2:
            raise ValueError(f"task.choice_columns {tuple(settings.choice_columns)}: expected "
                             f"two or more candidates")

    def read(self, path: str, labelled: bool) -> list[ChoiceExample]:
        s = self.settings
        fmt = tables.task_format(s, self.name, path)
        context, *choices = [tables.column(c, s.header)
                             for c in (s.context_column, *s.choice_columns)]
        question = None if s.question_column is None else tables.column(s.question_column,
                                                                        s.header)
        label = tables.column(s.label_column, s.header) if labelled else None
        columns = [context, *choices] + [c for c in (question, label) if c is not None]
        examples = []
        for where, values in tables.rows(path, fmt, columns, s.header):
            prefix = "" if question is None else tables.text(values[question], where,
                                                             question) + " "
            examples.append(ChoiceExample(
                where, tables.text(values[context], where, context),
                [prefix + tables.text(values[c], where, c) for c in choices],
                None if label is None else self._label(values[label], where, len(choices))))
        if not examples:
            raise ValueError(f"{path}: no examples")
        return examples

    def _label(self, value, where: str, choices: int) -> int:
        try:
            index = int(str(value).strip())
        except ValueError:
            index = -1
        if not 0 <= index < choices:
            raise ValueError(f"{where}: label {value!r} is not a candidate's index 0..."
                             f"{choices - 1}")
        return index

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        """input_ids / input_mask / segment_ids [N, C, L] and `label` [N]. An over-long row
        loses tokens from the end of its longer part, one at a time, as the original's
        SWAG rows did."""
        counts = {len(e.choices) for e in examples}
        if len(counts) > 1:
            odd = next(e for e in examples if len(e.choices) != len(examples[0].choices))
            raise ValueError(f"{odd.guid}: {len(odd.choices)} candidates, where "
                             f"{examples[0].guid} has {len(examples[0].choices)}: every "
                             f"example of a set needs as many")
        length = self.settings.max_seq_length
        packer = Packer(tokenizer, length)
        contexts = tokenizer.encode_batch([e.context for e in examples])
        endings = tokenizer.encode_batch([c for e in examples for c in e.choices])
        inputs, truncated, at = [], 0, 0
        for example, context in zip(examples, contexts):
            rows = []
            for ending in endings[at:at + len(example.choices)]:
                a, b = list(context), list(ending)
                while len(a) + len(b) > length - 3:
                    (a if len(a) > len(b) else b).pop()
                    truncated += 1
                rows.append(packer.pack(a, b))
            at += len(example.choices)
            inputs.append([np.stack(x) for x in zip(*rows)])
        arrays = {name: np.stack([x[i] for x in inputs]).astype(np.int32)
                  for i, name in enumerate(("input_ids", "input_mask", "segment_ids"))}
        if examples and examples[0].label is not None:
            arrays["label"] = np.array([e.label for e in examples], np.int32)
        if truncated:
            log.info("%d tokens truncated to fit rows of %d", truncated, length)
        return Features(arrays, {"examples": len(examples), "truncated": truncated})

    def examples_from_texts(self, texts, context: str = "") -> list[ChoiceExample]:
        """Each text is `context<TAB>candidate<TAB>candidate...`."""
        examples = []
        for i, text in enumerate(texts):
            context_text, *choices = text.split("\t")
            if len(choices) < 2:
                raise ValueError(f"text {i}: expected the context and two or more candidates, "
                                 f"separated by TABs")
            examples.append(ChoiceExample(f"text{i}", context_text, choices))
        return examples

    def model(self, config, labels):
        return BertForMultipleChoice(config)

    def loss_sum(self, logits_BC, batch):
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
            logits_BC, batch["label"].astype(jnp.int32)))

    def fetch(self, logits_BC):
        return jax.nn.softmax(logits_BC, axis=-1)

    def evaluate(self, taskset: TaskSet, probs_NC, labels):
        predicted = probs_NC.argmax(-1)
        scores = {}
        if taskset.labelled:
            scores = {"accuracy": metrics.accuracy(predicted,
                                                   taskset.features.arrays["label"])}
        records = []
        for example, probs, best in zip(taskset.examples, probs_NC, predicted):
            record = {"guid": example.guid, "context": example.context,
                      "choices": example.choices, "prediction": int(best),
                      "probabilities": [float(p) for p in probs]}
            if example.label is not None:
                record["label"] = example.label
            records.append(record)
        return scores, records

    def format_record(self, record: dict) -> str:
        best = record["prediction"]
        return (f"{best}  {record['probabilities'][best]:.3f}  {record['choices'][best]}")
