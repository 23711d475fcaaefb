"""Every key of a fine-tuning config, with its default: configs/finetune/*.py start from here.

Defaults are the original BERT fine-tuning recipe: the pretraining optimizer (AdamW without
bias correction, weight decay 0.01 off LayerNorm and biases, clip 1.0) at lr 5e-5 with 10%
linear warmup then linear decay, batch 32, 3 epochs, dropout 0.1. The loader
(`config_flags`, `lock_config=True`) rejects keys not listed here; `validate` checks the
values before anything runs. Lists (files, columns, splits) are tuples: on the command line,
repeat the flag (`--config.task.eval_files=dev.tsv --config.task.eval_files=test.tsv`) or
write a tuple (`--config.task.text_columns="('#1 String', '#2 String')"`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ml_collections
from ml_collections.config_dict import placeholder

from bertjax import files
from bertjax.training.pretrain_config import (DEFAULT_RULES, DTYPES, check_attention,
                                              check_dropout, check_profile_steps,
                                              check_remat_policy)

if TYPE_CHECKING:
    from bertjax.tasks.base import Task


def defaults() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.mode = "finetune"
    config.seed = 0
    # A model directory (`python -m bertjax.convert` output, or a run's exported WORKDIR/model)
    # or a pretraining workdir (its latest checkpoint). Its `bert` encoder is loaded; the task
    # head starts fresh.
    config.init_checkpoint = ""
    config.quiet = False

    config.task = ml_collections.ConfigDict()
    config.task.type = "classification"  # a task of bertjax/tasks (classification, tagging, ...)
    config.task.train_file = ""
    # Labelled files: each is evaluated (metrics + a predictions file).
    config.task.eval_files = ()
    # Unlabelled files: predictions only, after training.
    config.task.predict_files = ()
    # tsv | csv | jsonl | conll | squad; '' tells it from the task type and file extension.
    config.task.format = ""
    config.task.header = True  # TSV/CSV files start with a header line of column names
    # Column names (or 0-based positions in files without a header): one text column, or
    # two for sentence pairs.
    config.task.text_columns = ("sentence",)
    config.task.label_column = "label"
    # Instead of files: a TFDS dataset by name (glue/sst2, glue/mrpc, glue/stsb, squad, ...),
    # already prepared in tfds_data_dir ('' is TFDS's default).
    config.task.tfds_name = ""
    config.task.tfds_data_dir = ""
    config.task.tfds_train_split = "train"
    config.task.tfds_eval_splits = ("validation",)
    # Tagging: what the tags are, entity (BIO/BIOES spans: NER, chunks) | plain (classes:
    # part of speech) | segmentation (BMES/BIES character tags: Chinese word segmentation);
    # '' detects it from the training file.
    config.task.scheme = ""
    config.task.tag_scheme = ""  # entity tags: BIO | BIOES; '' detects it from the file
    config.task.strict_tags = False  # a tag breaking the scheme is an error, not a repair
    config.task.max_seq_length = 128
    # Windows over texts longer than a row start doc_stride tokens apart (SQuAD contexts,
    # tagging sentences); then SQuAD's answer search (see bertjax/tasks/spans.py).
    config.task.doc_stride = 128
    config.task.max_query_length = 64
    config.task.n_best = 20
    config.task.max_answer_length = 30
    config.task.version_2 = False  # SQuAD 2.0: questions may have no answer
    config.task.null_threshold = 0.0  # v2.0: no answer when null score - best span > this
    # seq2seq: decoder positions ([CLS] target [SEP]; longer targets are an error, and
    # generation stops there), beam search (1: greedy; length_penalty divides a finished
    # hypothesis' log-probability by its length to this power; early_stopping: stop a
    # sentence's search at num_beams finished hypotheses), and label smoothing of the
    # teacher-forced loss.
    config.task.max_target_length = 64
    config.task.num_beams = 4
    config.task.length_penalty = 1.0
    config.task.early_stopping = False
    config.task.label_smoothing = 0.0
    # seq2seq: the decoder runs the encoder's embeddings and layers (one set of weights, as
    # transformers' tie_encoder_decoder); only cross-attention and the LM head are its own.
    config.task.tie_encoder_decoder = False
    # seq2seq: the decoder starts as a copy of the checkpoint's encoder (and its masked-LM
    # head), as Rothe et al. (2020) warm-start BERT2BERT; False starts it fresh (their
    # BERT2Rnd, the baseline warm-starting is measured against).
    config.task.warm_start_decoder = True
    # unilm: the share of target tokens masked (and predicted) in each training step; UniLM
    # fine-tuned with 0.7.
    config.task.target_mask_rate = 0.7
    # The metric that picks the best evaluation: '' is accuracy (classification), pearson
    # (regression), f1 (tagging: entity F1, or word F1 for segmentation; plain tags:
    # token_accuracy; squad: F1; seq2seq and unilm: bleu).
    config.task.best_metric = ""
    config.task.tokenizer = ""  # '' uses the init checkpoint's (or its shard_dir's) tokenizer

    config.model = ml_collections.ConfigDict()
    # Compute dtype; parameters stay float32. auto: bfloat16 on GPUs and TPUs, float32 on CPUs.
    config.model.dtype = "auto"
    config.model.hidden_dropout_prob = 0.1
    config.model.attention_probs_dropout_prob = 0.1
    config.model.remat = False
    # What remat keeps for the backward pass: a jax.checkpoint_policies name
    # (nothing_saveable: recompute everything; dots_with_no_batch_dims_saveable: keep the
    # matmul outputs).
    config.model.remat_policy = "nothing_saveable"
    # One layer traced once and scanned over the depth (the program no longer grows with the
    # number of layers); parameters and checkpoints keep their per-layer layout.
    config.model.scan_layers = False
    # Dropout's random bits: threefry (JAX's default) | rbg | unsafe_rbg (XLA's
    # RngBitGenerator, native on TPUs and GPUs; on CPUs no reliable gain was measured) |
    # counter_hash (an integer hash of each element's index; on a CPU a mini pretraining
    # step 1.05x faster with the default 16-bit masks; models/dropout.py). Any of them
    # resumes exactly; they draw different masks.
    config.model.dropout_rng = "threefry"
    # Random bits per mask element: 16 (two draws per random word: half the generator's
    # work, 11% of a pretraining step on a CPU; rate 0.1 becomes 0.100006) | 32 (Flax's
    # nn.Dropout, the masks of runs before this option).
    config.model.dropout_mask_bits = 16
    # The last layer computes only the positions the heads read (the [CLS]s, in classification and regression; tagging and QA read every position); keys and values
    # still come from every position, so the outputs are the same, for 13% fewer FLOPs and a
    # 1.17x faster step in mini pretraining on a CPU. That layer's dropout masks differ.
    config.model.sparse_last_layer = True
    # Self-attention: xla (jax.nn.dot_product_attention; explicit scores while the
    # probabilities drop out) | splash (TPU's Pallas kernel, models/attention.py: keeps no
    # [B, H, L, L] probabilities for the backward pass; needs attention_probs_dropout_prob=0;
    # interpreted, slowly, off TPUs).
    config.model.attention = "xla"
    # The first N encoder layers of the checkpoint (smaller, faster models); None: all.
    config.model.keep_layers = placeholder(int)

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "bert_adamw"  # bert_adamw | adamw | lamb
    config.optimizer.schedule = "bert"  # bert | warmup_linear
    config.optimizer.learning_rate = 5e-5
    config.optimizer.warmup_proportion = 0.1  # of all training steps
    config.optimizer.weight_decay = 0.01
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.clip_norm = 1.0
    config.optimizer.grad_accum_steps = 1
    # The fresh task head learns at learning_rate times this (1: the original recipe). Short
    # runs reach a usable head sooner with more.
    config.optimizer.head_lr_multiplier = 1.0

    config.mesh = ml_collections.ConfigDict()
    config.mesh.shape = (-1, 1, 1)
    config.mesh.rules = DEFAULT_RULES

    config.train = ml_collections.ConfigDict()
    config.train.global_batch_size = 32
    config.train.num_epochs = 3.0
    config.train.eval_batch_size = 64  # global; evaluation pads its last batch
    # Ascending row lengths (<= task.max_seq_length) a batch may be cut to: each training
    # batch keeps the shortest that holds its longest example, and evaluation batches do
    # the same after sorting the rows by length, so short texts cost what they need and XLA
    # compiles one step per length used. (): every batch at task.max_seq_length, as the
    # original.
    config.train.bucket_lengths = ()
    # Up to this many training examples per row, each attending only to itself (positions
    # restart, one pooled [CLS] each), so short texts fill the rows; global_batch_size then
    # counts rows and the loss averages as before (over the examples; over the labelled
    # tokens for tagging). Sentence (pair) classification, regression and tagging; 1: one
    # example per row, as the original. Packed rows are full, so train.bucket_lengths then
    # cuts evaluation batches only.
    config.train.examples_per_row = 1
    config.train.log_every = 50
    config.train.keep_checkpoints = 2  # saved at every epoch end (and on preemption)
    config.train.peak_flops_per_device = 0.0  # for MFU; 0: known chips' table, else measured
    config.train.profile_steps = (0, 0)  # as in pretraining: (first, last + 1) to trace
    config.train.compilation_cache_dir = ""  # as in pretraining
    # A checkpoint that fails verification on resume is reported, removed and the next
    # older one used; False makes it an error instead.
    config.train.restore_fallback = True
    return config


def validate(config: ml_collections.ConfigDict) -> Task:
    """One clear error for the first value that cannot run; returns the task it names."""
    # Imported here, not above: the task modules bring JAX, and the launchers load the config
    # files (which import this module) only to parse them (see pretrain_config).
    from bertjax.tasks import base as tasks
    task = tasks.get(config.task.type)(config.task)
    if not config.init_checkpoint:
        raise ValueError("init_checkpoint is empty: set it to a model directory (python -m "
                         "bertjax.convert output, a run's WORKDIR/model) or a pretraining "
                         "workdir")
    # Task.load would find this only after the checkpoint was opened (and, through a
    # launcher, after the machines were created).
    if not config.task.train_file and not config.task.tfds_name:
        raise ValueError("task.train_file and task.tfds_name are both empty: set one of them "
                         "to the training data (--config.task.train_file=... or "
                         "--config.task.tfds_name=...)")
    if config.task.train_file and config.task.tfds_name:
        raise ValueError("task.train_file and task.tfds_name are both set: set one of them")
    best = config.task.best_metric or task.best_metric
    if best not in task.higher_is_better:
        raise ValueError(f"task.best_metric {best!r}: for {task.name} expected one of "
                         f"{', '.join(task.higher_is_better)}")
    for path in (*config.task.eval_files, *config.task.predict_files):
        if "," in path and not files.path(path).exists():
            raise FileNotFoundError(f"{path}: no such file; give several files by repeating "
                                    f"the flag, one file each")
    train = config.train
    for key in ("global_batch_size", "eval_batch_size", "log_every", "keep_checkpoints"):
        if train[key] <= 0:
            raise ValueError(f"train.{key} is {train[key]}: expected a positive number")
    if train.num_epochs <= 0:
        raise ValueError(f"train.num_epochs is {train.num_epochs}: expected > 0")
    if config.model.dtype not in DTYPES:
        raise ValueError(f"model.dtype {config.model.dtype!r}: expected one of "
                         f"{', '.join(DTYPES)}")
    check_profile_steps(train.profile_steps)
    check_dropout(config.model)
    check_attention(config.model)
    check_remat_policy(config.model.remat_policy)
    check_bucket_lengths(train.bucket_lengths, config.task.max_seq_length, task)
    if train.examples_per_row < 1:
        raise ValueError(f"train.examples_per_row is {train.examples_per_row}: expected 1 (no "
                         f"packing) or more")
    if train.examples_per_row > 1 and not task.packable:
        raise ValueError(f"train.examples_per_row {train.examples_per_row}: task.type "
                         f"{task.name} cannot hold several examples in a row; set it to 1")
    if config.optimizer.head_lr_multiplier <= 0:
        raise ValueError(f"optimizer.head_lr_multiplier {config.optimizer.head_lr_multiplier}: "
                         f"expected > 0")
    return task


def check_bucket_lengths(lengths, max_seq_length: int, task: Task) -> None:
    if not lengths:
        return
    if (list(lengths) != sorted(set(lengths)) or lengths[0] < 1
            or lengths[-1] > max_seq_length):
        raise ValueError(f"train.bucket_lengths {tuple(lengths)}: expected ascending distinct "
                         f"lengths from 1 to task.max_seq_length {max_seq_length}")
    if task.no_bucketing_because:
        raise ValueError(f"train.bucket_lengths: task.type {task.name} cannot cut its batches: "
                         f"{task.no_bucketing_because}; set train.bucket_lengths=()")
