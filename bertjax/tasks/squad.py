"""Extractive question answering (SQuAD v1.1 and v2.0), as the original run_squad: start and
end scores per token from the last hidden states, answers by the n-best span search."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from bertjax.models.heads import BertForQuestionAnswering
from bertjax.tasks import metrics, spans
from bertjax.tasks.base import Task, TaskSet, register
from bertjax.tasks.tables import tfds_rows
from bertjax.tasks.features import Features
from bertjax.tasks.squad_inputs import (SquadExample, read_squad, squad_examples_from_tfds,
                                        squad_features)

TFDS_NAMES = ("squad", "squad/v1.1", "squad/v2.0")


@register
class Squad(Task):
    name = "squad"
    command = "qa"
    targets = ("start_positions", "end_positions")
    best_metric = "f1"
    higher_is_better = ("f1", "exact")
    saved_settings = ("max_seq_length", "doc_stride", "max_query_length", "n_best",
                      "max_answer_length", "version_2", "null_threshold")
    no_bucketing_because = ("its span softmax runs over every position, padding included, as "
                            "the original's does, so cutting them would change the loss")

    @classmethod
    def own_settings(cls) -> dict:
        return {
            # Windows over contexts longer than a row start doc_stride tokens apart; then the
            # answer search (see bertjax/tasks/spans.py).
            "doc_stride": 128,
            "max_query_length": 64,
            "n_best": 20,
            "max_answer_length": 30,
            "version_2": False,  # SQuAD 2.0: questions may have no answer
            "null_threshold": 0.0,  # v2.0: no answer when null score - best span > this
        }

    def read(self, path: str, labelled: bool) -> list[SquadExample]:
        if self.settings.format and self.settings.format != "squad":
            raise ValueError(f"{path}: task.type squad reads squad files, not "
                             f"{self.settings.format}")
        return read_squad(path)

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list[SquadExample]:
        if name not in TFDS_NAMES:
            raise ValueError(f"TFDS dataset {name!r}: expected one of {', '.join(TFDS_NAMES)}")
        _, rows = tfds_rows(name, split, data_dir)
        return squad_examples_from_tfds(rows, f"tfds:{name}/{split}")

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        s = self.settings
        return squad_features(examples, tokenizer, s.max_seq_length, s.doc_stride,
                              s.max_query_length, training=training)

    def examples_from_texts(self, texts, context: str = "") -> list[SquadExample]:
        if not context:
            raise ValueError("a question-answering model needs a context to answer from")
        return [SquadExample(f"text{i}", t, context, []) for i, t in enumerate(texts)]

    def model(self, config, labels):
        return BertForQuestionAnswering(config)

    def loss_sum(self, outputs, batch):
        ce = optax.softmax_cross_entropy_with_integer_labels
        return 0.5 * jnp.sum(
            ce(outputs["start_logits"], batch["start_positions"].astype(jnp.int32))
            + ce(outputs["end_logits"], batch["end_positions"].astype(jnp.int32)))

    def evaluate(self, taskset: TaskSet, outputs, labels):
        s = self.settings
        answers = spans.best_answers(
            taskset.examples, taskset.features, outputs["start_logits"], outputs["end_logits"],
            n_best=s.n_best, max_answer_length=s.max_answer_length, version_2=s.version_2,
            null_threshold=s.null_threshold)
        scores = {}
        if taskset.labelled:
            gold = {e.qid: e.answers for e in taskset.examples}
            scores = metrics.squad_scores(
                answers["predictions"], gold, answers["best_span"] if s.version_2 else None,
                answers.get("null_odds"))
        records = []
        for example in taskset.examples:
            record = {"id": example.qid, "question": example.question,
                      "prediction": answers["predictions"][example.qid],
                      "best_span": answers["best_span"][example.qid],
                      "nbest": answers["nbest"][example.qid][:5]}
            if "null_odds" in answers:
                record["null_odds"] = answers["null_odds"][example.qid]
            if taskset.labelled:
                record["answers"] = example.answers
            records.append(record)
        return scores, records

    def extra_outputs(self, records: list[dict]) -> dict:
        # The official evaluation script's format: {question id: answer}.
        return {"answers.json": {r["id"]: r["prediction"] for r in records}}

    def format_record(self, record: dict) -> str:
        best = record["nbest"][0]["probability"] if record["nbest"] else 0.0
        answer = record["prediction"] or "(no answer)"
        return f"{record['question']}\n  {answer}  {best:.3f}"
