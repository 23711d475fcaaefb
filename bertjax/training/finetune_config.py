"""Every key of a fine-tuning config, with its default: configs/finetune/*.py start from here.
The `task` section is the task's own, defined in its file (tasks/*.py, Task.settings); the
shared sections come from config_sections.py, as pretraining's do.

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
from bertjax.training import config_sections as sections

if TYPE_CHECKING:
    from bertjax.tasks.base import Task


def defaults(task_type: str = "classification") -> ml_collections.ConfigDict:
    """Every key of a fine-tuning config for `task_type`: its `task` section is the one the
    task defines (Task.settings, in the task's own file)."""
    # Imported here: the task modules bring JAX, and config_sections' reason holds for the
    # rest of this module.
    from bertjax.tasks import base as tasks

    config = ml_collections.ConfigDict()
    config.mode = "finetune"
    config.seed = 0
    # A model directory (`python -m bertjax.convert` output, or a run's exported WORKDIR/model)
    # or a pretraining workdir (its latest checkpoint). Its `bert` encoder is loaded; the task
    # head starts fresh.
    config.init_checkpoint = placeholder(str)
    config.quiet = False

    config.task = tasks.get(task_type).settings()

    config.model = sections.model_options(ml_collections.ConfigDict())
    # The first N encoder layers of the checkpoint (smaller, faster models); None: all.
    config.model.keep_layers = placeholder(int)

    config.optimizer = sections.optimizer_section(learning_rate=5e-5)
    config.optimizer.warmup_proportion = 0.1  # of all training steps
    # The fresh task head learns at learning_rate times this (1: the original recipe). Short
    # runs reach a usable head sooner with more.
    config.optimizer.head_lr_multiplier = 1.0

    config.mesh = sections.mesh_section()

    # Checkpoints are saved at every epoch end (and on preemption).
    config.train = sections.train_section(global_batch_size=32, log_every=50,
                                          keep_checkpoints=2)
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
    # tokens for tagging). For the tasks that can hold several (Task.packable); 1: one
    # example per row, as the original. Packed rows are full, so train.bucket_lengths then
    # cuts evaluation batches only.
    config.train.examples_per_row = 1
    return config


def validate(config: ml_collections.ConfigDict) -> Task:
    """One clear error for the first value that cannot run; returns the task it names."""
    from bertjax.tasks import base as tasks
    task_class = tasks.get(config.task.type)
    own, given = set(task_class.settings().keys()), set(config.task.keys())
    if own != given:
        raise ValueError(f"task.type {config.task.type}: the config's task section was made for "
                         f"another task (its keys {', '.join(sorted(given - own) or ['-'])} are "
                         f"not {config.task.type}'s, and it lacks "
                         f"{', '.join(sorted(own - given)) or '-'}); start from "
                         f"finetune_config.defaults({config.task.type!r}), a config of "
                         f"configs/finetune/ for this task")
    task = task_class(config.task)
    if not config.init_checkpoint:
        raise ValueError("init_checkpoint is not set: set it to a model directory (python -m "
                         "bertjax.convert output, a run's WORKDIR/model) or a pretraining "
                         "workdir")
    # Task.load would find this only after the checkpoint was opened (and, through a
    # launcher, after the machines were created).
    if not config.task.train_file and not config.task.tfds_name:
        raise ValueError("task.train_file and task.tfds_name are both unset: set one of them "
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
    sections.check_train(train, positive=("eval_batch_size",))
    if train.num_epochs <= 0:
        raise ValueError(f"train.num_epochs is {train.num_epochs}: expected > 0")
    sections.check_optimizer(config.optimizer)
    sections.check_model(config.model)
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
