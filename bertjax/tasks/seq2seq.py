"""Text-to-text generation (translation, paraphrase, summarisation, ...), evaluated on what
the model generates (greedy or beam search):

- `seq2seq`, BERT2BERT: the encoder from the checkpoint, the decoder warm-started from the
  same encoder weights with fresh cross-attention (Rothe, Narayan and Severyn 2020), trained
  by teacher forcing;
- `unilm`, one stack: the checkpoint's BERT and masked-LM head over `[CLS] source [SEP]
  target [SEP]` under the seq2seq mask (UniLM, Dong et al. 2019), trained by masking target
  tokens and predicting them, generating by appending.

Files: TSV/CSV/JSONL with a source and a target column (`task.text_columns`, one column, and
`task.label_column`; `source` and `target` in configs/finetune/seq2seq.py), or a headerless
`source<TAB>target` TSV with columns 0 and 1. Scores: BLEU and chrF (sacrebleu) and
ROUGE-L F1 (rouge-score), on the detokenized predictions against the references as written.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import decoding
from bertjax.models.seq2seq import Bert2Bert, UniLM
from bertjax.tasks.base import INPUTS, Task, TaskSet, register
from bertjax.tasks import tables
from bertjax.tasks.classify import TextExample, read_task_table
from bertjax.tasks.tables import tfds_rows
from bertjax.tasks.features import Features, Packer, stack

log = logging.getLogger(__name__)


def target_tokens(tokenizer, target: str, where: str, max_target_length: int) -> list[int]:
    """`[CLS] target [SEP]`, at most max_target_length ids (what generation produces)."""
    ids = [tokenizer.cls_id, *tokenizer.encode(target), tokenizer.sep_id]
    if len(ids) > max_target_length:
        raise ValueError(f"{where}: the target is {len(ids)} tokens with [CLS] and [SEP], "
                         f"longer than task.max_target_length {max_target_length}; raise it "
                         f"(at most the model's max_position_embeddings) or shorten the target")
    return ids


def target_features(tokenizer, target: str, where: str, max_target_length: int):
    """`[CLS] target [SEP]` padded to max_target_length: (target_ids, target_mask) int32."""
    ids = target_tokens(tokenizer, target, where, max_target_length)
    pad = max_target_length - len(ids)
    return (np.array(ids + [tokenizer.pad_id] * pad, np.int32),
            np.array([1] * len(ids) + [0] * pad, np.int32))


def token_cross_entropy(logits_BTV, labels_BT, label_smoothing: float):
    """Cross-entropy [B, T] against labels smoothed by `label_smoothing` (optax.smooth_labels'
    (1 - a) one-hot + a / V), from integer labels: no [B, T, V] one-hot is built, which at
    BERT's vocabulary would cost as much memory as the logits."""
    log_probs_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    nll_BT = -jnp.take_along_axis(log_probs_BTV, labels_BT[..., None], axis=-1)[..., 0]
    if not label_smoothing:
        return nll_BT
    return (1.0 - label_smoothing) * nll_BT - label_smoothing * jnp.mean(log_probs_BTV, axis=-1)


def score(predictions: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF (sacrebleu's defaults) and mean ROUGE-L F1 (x 100)."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge = [scorer.score(ref, pred)["rougeL"].fmeasure
             for pred, ref in zip(predictions, references)]
    return {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
            "chrf": sacrebleu.corpus_chrf(predictions, [references]).score,
            "rougeL": 100.0 * float(np.mean(rouge))}


def _check_same_shapes(stored, expected) -> None:
    def shapes(tree):
        return {jax.tree_util.keystr(p): tuple(x.shape)
                for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    differ = sorted(set(shapes(stored).items()) ^ set(shapes(expected).items()))
    if differ:
        raise ValueError(f"init_checkpoint's decoder does not fit the model (model.keep_layers "
                         f"or another architecture?): {differ[0][0]} differs")


@register
class Seq2Seq(Task):
    """Reads its files as tables (classify.read_task_table), one text column for the source
    and the label column for the target."""

    name = "seq2seq"
    command = "generate"
    targets = ("target_ids", "target_mask")
    best_metric = "bleu"
    higher_is_better = ("bleu", "chrf", "rougeL")
    uses_labels = False
    no_bucketing_because = ("its target arrays have their own length, which cutting by the "
                            "input's would corrupt")
    saved_settings = ("max_seq_length", "max_target_length", "num_beams", "length_penalty",
                      "early_stopping", "label_smoothing", "tie_encoder_decoder")

    # The tokenizer of the features, bound by `featurize`: decoding needs its [CLS], [SEP]
    # and [PAD] ids and evaluation its detokenizer.
    tokenizer = None

    @classmethod
    def own_settings(cls) -> dict:
        return {
            **tables.settings(),
            # Decoder positions ([CLS] target [SEP]; longer targets are an error, and
            # generation stops there).
            "max_target_length": 64,
            # Beam search (1: greedy); length_penalty divides a finished hypothesis'
            # log-probability by its length to this power; early_stopping stops a sentence's
            # search at num_beams finished hypotheses.
            "num_beams": 4,
            "length_penalty": 1.0,
            "early_stopping": False,
            "label_smoothing": 0.0,  # of the teacher-forced loss
            # The decoder runs the encoder's embeddings and layers (one set of weights, as
            # transformers' tie_encoder_decoder); only cross-attention and the LM head are
            # its own.
            "tie_encoder_decoder": False,
            # The decoder starts as a copy of the checkpoint's encoder (and its masked-LM
            # head), as Rothe et al. (2020) warm-start BERT2BERT; False starts it fresh
            # (their BERT2Rnd, the baseline warm-starting is measured against).
            "warm_start_decoder": True,
        }

    def __init__(self, settings):
        super().__init__(settings)
        if settings.max_target_length < 3:
            raise ValueError(f"task.max_target_length {settings.max_target_length}: at least 3 "
                             f"([CLS], a token, [SEP])")
        if settings.num_beams < 1:
            raise ValueError(f"task.num_beams {settings.num_beams}: at least 1 (1 is greedy)")
        if not 0.0 <= settings.label_smoothing < 1.0:
            raise ValueError(f"task.label_smoothing {settings.label_smoothing}: in [0, 1)")

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list[TextExample]:
        """A prepared TFDS text-to-text dataset, the source from its feature named by
        task.text_columns and the target from task.label_column's (gigaword: document,
        summary; cnn_dailymail: article, highlights; wmt14_translate/de-en: de, en)."""
        if len(self.settings.text_columns) != 1:
            raise ValueError(f"task.text_columns {self.settings.text_columns}: a {self.name} "
                             f"source is one feature")
        (source_key,), target_key = self.settings.text_columns, self.settings.label_column
        examples = []
        for i, row in enumerate(tfds_rows(name, split, data_dir)[1]):
            missing = [k for k in (source_key, target_key) if k not in row]
            if missing:
                raise ValueError(f"TFDS dataset {name} has no feature {missing[0]!r} (set "
                                 f"task.text_columns and task.label_column to its source and "
                                 f"target; it has {', '.join(sorted(row))})")
            examples.append(TextExample(f"tfds:{name}/{split}:{i}",
                                        row[source_key].decode("utf-8"),
                                        label=row[target_key].decode("utf-8")))
        return examples

    def read(self, path: str, labelled: bool) -> list[TextExample]:
        return read_task_table(self.settings, self.name, path, labelled)

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        s = self.settings
        self.tokenizer = tokenizer
        packer = Packer(tokenizer, s.max_seq_length)
        rows, truncated = [], 0
        for example, ids in zip(examples, tokenizer.encode_batch([e.text_a for e in examples])):
            if not ids:
                raise ValueError(f"{example.guid}: the source is empty")
            truncated += len(ids) > s.max_seq_length - 2
            row = packer.pack(ids[:s.max_seq_length - 2])
            if example.label is not None:
                row = (*row, *target_features(tokenizer, example.label, example.guid,
                                              s.max_target_length))
            rows.append(row)
        if truncated:
            log.info("%d of %d sources truncated to %d tokens", truncated, len(examples),
                     s.max_seq_length)
        labelled = bool(examples) and examples[0].label is not None
        names = ["input_ids", "input_mask", "segment_ids"] + (list(self.targets) if labelled
                                                              else [])
        return Features(stack(rows, names), {"examples": len(examples), "truncated": truncated})

    def examples_from_texts(self, texts, context: str = "") -> list[TextExample]:
        return [TextExample(f"text{i}", text) for i, text in enumerate(texts)]

    def model(self, config, labels):
        if self.settings.max_target_length > config.max_position_embeddings:
            raise ValueError(f"task.max_target_length {self.settings.max_target_length} "
                             f"exceeds the model's max_position_embeddings "
                             f"{config.max_position_embeddings}")
        return Bert2Bert(config, tie_encoder_decoder=self.settings.tie_encoder_decoder)

    def warm_start(self, params: dict, checkpoint: dict) -> dict:
        """With task.warm_start_decoder=False the decoder keeps its fresh initialisation.
        Otherwise a checkpoint that has a decoder (a converted EncoderDecoderModel, a seq2seq model)
        gives it whole. Otherwise the decoder's LM head is the checkpoint's masked-LM head if
        it has one, and (unless tied to the encoder) its embeddings and layers copies of the
        encoder's, which then train apart; cross-attention starts fresh."""
        fresh = params["decoder"]
        if not self.settings.warm_start_decoder:
            if self.settings.tie_encoder_decoder:
                raise ValueError("task.warm_start_decoder=False with task.tie_encoder_decoder="
                                 "True: a tied decoder is the encoder; untie it to start the "
                                 "decoder fresh")
            return params
        if "decoder" in checkpoint:
            _check_same_shapes(checkpoint["decoder"], fresh)
            return {**params, "decoder": checkpoint["decoder"]}
        head = fresh["mlm"]
        if "mlm" in checkpoint:
            _check_same_shapes(checkpoint["mlm"], head)
            head = checkpoint["mlm"]
        if self.settings.tie_encoder_decoder:
            return {**params, "decoder": {**fresh, "mlm": head}}
        encoder, decoder = params["bert"], fresh["bert"]
        copied = {"embeddings": encoder["embeddings"],
                  "encoder": {name: {**decoder["encoder"][name], **layer}
                              for name, layer in encoder["encoder"].items()}}
        return {**params, "decoder": {"bert": jax.tree.map(jnp.copy, copied), "mlm": head}}

    def normalizer(self, batch: dict):
        return jnp.sum(batch["target_mask"][:, 1:]).astype(jnp.float32)

    def forward(self, module, variables: dict, batch: dict, **kwargs):
        """Teacher forcing: the decoder reads the target but its last token and predicts it
        but its first."""
        return module.apply(variables, batch["input_ids"], batch["input_mask"],
                            batch["segment_ids"], batch["target_ids"][:, :-1],
                            batch["target_mask"][:, :-1], **kwargs)

    def loss_sum(self, logits_BTV, batch):
        weights_BT = batch["target_mask"][:, 1:].astype(jnp.float32)
        return jnp.sum(token_cross_entropy(logits_BTV, batch["target_ids"][:, 1:],
                                           self.settings.label_smoothing) * weights_BT)

    def decoding(self) -> decoding.Settings:
        if self.tokenizer is None:
            raise RuntimeError("seq2seq decodes features it made: call featurize first")
        s = self.settings
        return decoding.Settings(
            start_id=self.tokenizer.cls_id, eos_id=self.tokenizer.sep_id,
            pad_id=self.tokenizer.pad_id, max_length=s.max_target_length,
            num_beams=s.num_beams, length_penalty=s.length_penalty,
            early_stopping=s.early_stopping)

    def infer(self, module, params, batch: dict):
        return decoding.generate(module, params, batch["input_ids"], batch["input_mask"],
                                 batch["segment_ids"], self.decoding())

    def text(self, ids_T) -> str:
        """The generated text: the tokens after the start token, up to [SEP]."""
        ids = [int(t) for t in ids_T[1:]]
        if self.tokenizer.sep_id in ids:
            ids = ids[:ids.index(self.tokenizer.sep_id)]
        return self.tokenizer.decode(ids)

    def evaluate(self, taskset: TaskSet, tokens_NT, labels):
        predictions = [self.text(row) for row in tokens_NT]
        records = [{"guid": e.guid, "source": e.text_a, "prediction": p,
                    **({"target": e.label} if e.label is not None else {})}
                   for e, p in zip(taskset.examples, predictions)]
        scores = {}
        if taskset.labelled:
            scores = score(predictions, [e.label for e in taskset.examples])
        return scores, records

    def format_record(self, record: dict) -> str:
        return record["prediction"]


@register
class OneStackSeq2Seq(Seq2Seq):
    """UniLM's seq2seq fine-tuning. A row is `[CLS] source [SEP]` with room after it for
    task.max_target_length - 1 target tokens (the count BERT2BERT's `[CLS] target [SEP]`
    allows); training puts `target [SEP]` there (its positions following the source's, as
    when generating). Each training step masks every target token (the final [SEP] included, so the
    model learns where to stop) with probability task.target_mask_rate, drawn afresh each
    step, and predicts the masked ones from the source and the target before them."""

    name = "unilm"
    targets = ("target_positions", "target_ids", "target_mask")
    no_bucketing_because = ("its rows hold the source and the target (task.max_seq_length + "
                            "task.max_target_length positions), beyond the source's lengths "
                            "that train.bucket_lengths names")
    saved_settings = Seq2Seq.saved_settings + ("warm_start_decoder", "target_mask_rate")

    @classmethod
    def own_settings(cls) -> dict:
        # The share of target tokens masked (and predicted) in each training step; UniLM
        # fine-tuned with 0.7.
        return {**super().own_settings(), "target_mask_rate": 0.7}

    def __init__(self, settings):
        super().__init__(settings)
        if settings.tie_encoder_decoder:
            raise ValueError("task.tie_encoder_decoder: unilm is one stack already; the option "
                             "is seq2seq's (BERT2BERT)")
        if not settings.warm_start_decoder:
            raise ValueError("task.warm_start_decoder=False: unilm has no decoder to start "
                             "fresh; the option is seq2seq's (BERT2BERT)")
        if not 0.0 < settings.target_mask_rate <= 1.0:
            raise ValueError(f"task.target_mask_rate {settings.target_mask_rate}: in (0, 1]")

    @property
    def row_length(self) -> int:
        return self.settings.max_seq_length + self.settings.max_target_length

    def featurize(self, examples, tokenizer, labels, training: bool = False) -> Features:
        s = self.settings
        self.tokenizer = tokenizer
        packer = Packer(tokenizer, self.row_length)
        slots = s.max_target_length - 1
        rows, truncated = [], 0
        for example, ids in zip(examples, tokenizer.encode_batch([e.text_a for e in examples])):
            if not ids:
                raise ValueError(f"{example.guid}: the source is empty")
            truncated += len(ids) > s.max_seq_length - 2
            source = ids[:s.max_seq_length - 2]
            row = packer.pack(source)
            if example.label is not None:
                # `target [SEP]`: the [CLS] that starts a generated sequence has no slot.
                target = target_tokens(tokenizer, example.label, example.guid,
                                       s.max_target_length)[1:]
                first, pad = len(source) + 2, slots - len(target)
                row = (*row,
                       np.array([*range(first, first + len(target))] + [0] * pad, np.int32),
                       np.array(target + [tokenizer.pad_id] * pad, np.int32),
                       np.array([1] * len(target) + [0] * pad, np.int32))
            rows.append(row)
        if truncated:
            log.info("%d of %d sources truncated to %d tokens", truncated, len(examples),
                     s.max_seq_length)
        labelled = bool(examples) and examples[0].label is not None
        names = list(INPUTS) + (list(self.targets) if labelled else [])
        return Features(stack(rows, names), {"examples": len(examples), "truncated": truncated})

    def model(self, config, labels):
        if self.row_length > config.max_position_embeddings:
            raise ValueError(f"task.max_seq_length + task.max_target_length = "
                             f"{self.row_length} exceeds the model's max_position_embeddings "
                             f"{config.max_position_embeddings}: unilm puts source and target "
                             f"in one row")
        return UniLM(config)

    def warm_start(self, params: dict, checkpoint: dict) -> dict:
        """The masked-LM head from the checkpoint when it has one: UniLM predicts target
        tokens as pretraining predicted masked ones."""
        if "mlm" not in checkpoint:
            return params
        _check_same_shapes(checkpoint["mlm"], params["mlm"])
        return {**params, "mlm": checkpoint["mlm"]}

    def normalizer(self, batch: dict):
        """The expected number of masked target tokens: the masks are drawn inside each
        micro-batch's step, but the whole batch's denominator is fixed before them."""
        return self.settings.target_mask_rate * jnp.sum(batch["target_mask"]).astype(
            jnp.float32)

    def forward(self, module, variables: dict, batch: dict, deterministic: bool = True,
                rngs=None):
        """(logits [B, T, V] at the target positions, which of them were masked). The rows
        hold the source alone (as when generating); the target goes in here, its masked
        tokens as [MASK]."""
        positions_BT, target_BT = batch["target_positions"], batch["target_mask"].astype(bool)
        masked_BT = target_BT
        if not deterministic:
            draw_BT = jax.random.uniform(jax.random.fold_in(rngs["dropout"], 0x6d61736b),
                                         positions_BT.shape)
            masked_BT = target_BT & (draw_BT < self.settings.target_mask_rate)
        rows_B1 = jnp.arange(positions_BT.shape[0])[:, None]

        def put(x_BL, value_BT):
            # Empty target slots point at position 0 and write back what is there.
            kept_BT = x_BL[rows_B1, positions_BT]
            return x_BL.at[rows_B1, positions_BT].set(jnp.where(target_BT, value_BT, kept_BT))

        shown_BT = jnp.where(masked_BT, self.tokenizer.mask_id, batch["target_ids"])
        logits_BTV = module.apply(variables, put(batch["input_ids"], shown_BT),
                                  put(batch["input_mask"], 1), put(batch["segment_ids"], 1),
                                  positions_BT, deterministic=deterministic, rngs=rngs)
        return logits_BTV, masked_BT

    def loss_sum(self, outputs, batch):
        logits_BTV, masked_BT = outputs
        return jnp.sum(token_cross_entropy(logits_BTV, batch["target_ids"],
                                           self.settings.label_smoothing) * masked_BT)

    def decoding(self) -> decoding.Settings:
        return dataclasses.replace(super().decoding(), mask_id=self.tokenizer.mask_id)
