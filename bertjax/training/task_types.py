"""The four fine-tuning task types: each names its head, its loss, what the evaluation fetches
from the devices, and how those outputs become metrics and prediction records.

Losses are sums divided by a whole-batch total (`normalizer`), so gradients accumulated over
micro-batches equal the full batch's: classification and QA average over sequences, tagging
over the labelled first sub-tokens (positions with label -1 are ignored).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.data import conll, spans
from bertjax.data.features import LabelVocab
from bertjax.models.bert import BertConfig
from bertjax.models.heads import (BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification)
from bertjax.training import task_metrics

INPUTS = ("input_ids", "input_mask", "segment_ids")


class TaskType:
    head: str  # the head's name in the parameter tree, beside 'bert'
    targets: tuple[str, ...]  # feature arrays the loss reads
    best_metric: str
    higher_is_better: tuple[str, ...]  # what task.best_metric may name

    def evaluate(self, task, taskset, outputs, labels) -> tuple[dict, list[dict]]:
        """(metrics, or {} for an unlabelled set; one prediction record per example)."""
        metrics = self.metrics(task, taskset, outputs, labels) if taskset.labelled else {}
        return metrics, self.records(task, taskset, outputs, labels)


class Classification(TaskType):
    head = "classifier"
    targets = ("label",)
    best_metric = "accuracy"
    higher_is_better = ("accuracy", "macro_f1", "mcc", "f1")

    def model(self, config: BertConfig, labels: LabelVocab | None):
        return BertForSequenceClassification(config, len(labels))

    def normalizer(self, batch):
        return jnp.asarray(batch["input_ids"].shape[0], jnp.float32)

    def loss_sum(self, logits_BC, batch):
        labels_B = batch["label"].astype(jnp.int32)
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits_BC, labels_B))

    def fetch(self, logits_BC):
        return jax.nn.softmax(logits_BC, axis=-1)

    def metrics(self, task, taskset, probs_NC, labels: LabelVocab) -> dict:
        gold, pred = taskset.features.arrays["label"], probs_NC.argmax(-1)
        out = {"accuracy": task_metrics.accuracy(pred, gold),
               "macro_f1": task_metrics.f1(pred, gold, "macro"),
               "mcc": task_metrics.matthews_corrcoef(pred, gold)}
        if len(labels) == 2:
            out["f1"] = task_metrics.f1(pred, gold, positive=1)
        return out

    def records(self, task, taskset, probs_NC, labels: LabelVocab) -> list[dict]:
        out = []
        for example, probs in zip(taskset.examples, probs_NC):
            best = int(probs.argmax())
            record = {"guid": example.guid, "text_a": example.text_a}
            if example.text_b is not None:
                record["text_b"] = example.text_b
            if example.label is not None:
                record["label"] = example.label
            record.update(prediction=labels.labels[best], probability=float(probs[best]),
                          probabilities={l: float(p) for l, p in zip(labels.labels, probs)})
            out.append(record)
        return out


class Regression(TaskType):
    head = "classifier"
    targets = ("label",)
    best_metric = "pearson"
    higher_is_better = ("pearson", "spearman")

    def model(self, config: BertConfig, labels):
        return BertForSequenceClassification(config, 1)

    normalizer = Classification.normalizer

    def loss_sum(self, logits_B1, batch):
        return jnp.sum(jnp.square(logits_B1[:, 0] - batch["label"].astype(jnp.float32)))

    def fetch(self, logits_B1):
        return logits_B1[:, 0]

    def metrics(self, task, taskset, scores_N, labels) -> dict:
        gold = taskset.features.arrays["label"]
        return {"pearson": task_metrics.pearson(scores_N, gold),
                "spearman": task_metrics.spearman(scores_N, gold),
                "mse": float(np.mean(np.square(scores_N - gold)))}

    def records(self, task, taskset, scores_N, labels) -> list[dict]:
        out = []
        for example, score in zip(taskset.examples, scores_N):
            record = {"guid": example.guid, "text_a": example.text_a}
            if example.text_b is not None:
                record["text_b"] = example.text_b
            if example.label is not None:
                record["label"] = example.label
            record["prediction"] = float(score)
            out.append(record)
        return out


class Tagging(TaskType):
    head = "classifier"
    targets = ("label_ids",)
    best_metric = "f1"
    higher_is_better = ("f1", "precision", "recall", "token_accuracy")

    def model(self, config: BertConfig, labels: LabelVocab):
        return BertForTokenClassification(config, len(labels))

    def normalizer(self, batch):
        return jnp.maximum(jnp.sum((batch["label_ids"] >= 0).astype(jnp.float32)), 1.0)

    def loss_sum(self, logits_BLC, batch):
        labels_BL = batch["label_ids"].astype(jnp.int32)
        ce_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLC,
                                                                jnp.maximum(labels_BL, 0))
        return jnp.sum(jnp.where(labels_BL >= 0, ce_BL, 0.0))

    def fetch(self, logits_BLC):
        return jnp.argmax(logits_BLC, axis=-1).astype(jnp.int32)

    def _tags(self, taskset, ids_NL, labels: LabelVocab) -> list[list[str]]:
        words = conll.word_predictions(taskset.features, ids_NL, taskset.examples)
        return [[labels.labels[i] for i in w] for w in words]

    def metrics(self, task, taskset, ids_NL, labels: LabelVocab) -> dict:
        predicted = self._tags(taskset, ids_NL, labels)
        gold = [s.tags for s in taskset.examples]
        scores = task_metrics.entity_scores(gold, predicted)
        correct = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs))
        out = {k: scores[k] for k in ("precision", "recall", "f1")}
        out["token_accuracy"] = correct / sum(len(g) for g in gold)
        return out

    def records(self, task, taskset, ids_NL, labels: LabelVocab) -> list[dict]:
        out = []
        for sentence, tags in zip(taskset.examples, self._tags(taskset, ids_NL, labels)):
            record = {"guid": sentence.guid, "words": sentence.words}
            if sentence.tags is not None:
                record["tags"] = sentence.tags
            record["predictions"] = tags
            out.append(record)
        return out


class Squad(TaskType):
    head = "qa_outputs"
    targets = ("start_positions", "end_positions")
    best_metric = "f1"
    higher_is_better = ("f1", "exact")

    def model(self, config: BertConfig, labels):
        return BertForQuestionAnswering(config)

    normalizer = Classification.normalizer

    def loss_sum(self, outputs, batch):
        ce = optax.softmax_cross_entropy_with_integer_labels
        return 0.5 * jnp.sum(
            ce(outputs["start_logits"], batch["start_positions"].astype(jnp.int32))
            + ce(outputs["end_logits"], batch["end_positions"].astype(jnp.int32)))

    def fetch(self, outputs):
        return outputs

    def evaluate(self, task, taskset, outputs, labels) -> tuple[dict, list[dict]]:
        answers = spans.best_answers(
            taskset.examples, taskset.features, outputs["start_logits"], outputs["end_logits"],
            n_best=task.n_best, max_answer_length=task.max_answer_length,
            version_2=task.version_2, null_threshold=task.null_threshold)
        metrics = {}
        if taskset.labelled:
            gold = {e.qid: e.answers for e in taskset.examples}
            metrics = task_metrics.squad_scores(
                answers["predictions"], gold, answers["best_span"] if task.version_2 else None,
                answers.get("null_odds"))
        return metrics, self._records(taskset, answers)

    def _records(self, taskset, answers: dict) -> list[dict]:
        out = []
        for example in taskset.examples:
            record = {"id": example.qid, "question": example.question,
                      "prediction": answers["predictions"][example.qid],
                      "best_span": answers["best_span"][example.qid],
                      "nbest": answers["nbest"][example.qid][:5]}
            if "null_odds" in answers:
                record["null_odds"] = answers["null_odds"][example.qid]
            if taskset.labelled:
                record["answers"] = example.answers
            out.append(record)
        return out


TASK_TYPES: dict[str, TaskType] = {"classification": Classification(), "regression": Regression(),
                              "tagging": Tagging(), "squad": Squad()}


def task_type(name: str) -> TaskType:
    if name not in TASK_TYPES:
        raise ValueError(f"task.type {name!r}: expected one of {', '.join(TASK_TYPES)}")
    return TASK_TYPES[name]
