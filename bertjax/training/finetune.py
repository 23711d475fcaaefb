"""Fine-tuning as a client of the trainer: the task (looked up by `task.type`) supplies the
data, the head, the loss and the evaluation; this file joins them.

The encoder comes from `init_checkpoint` (a model directory, a finished run's workdir or a
pretraining workdir), the head starts fresh unless the task's `warm_start` takes it (or more)
from the checkpoint. Each process reads the whole (small) task data and feeds its own rows of
every global batch; the training order is a permutation per epoch from (seed, epoch), so a
resumed run sees the batches an uninterrupted one would.

After every epoch (and at the end) each evaluation set is scored; metrics go to
WORKDIR/metrics.jsonl and TensorBoard, predictions to WORKDIR/predictions/<set>.jsonl, and at
the end the best and final metrics to WORKDIR/eval_results.json. The fine-tuned model is
exported to WORKDIR/model (a model directory plus task.json and labels.json) for
`python -m bertjax.predict`.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax

from bertjax import batching, files
from bertjax.data.tokenizers import load_tokenizer
from bertjax.models.bert import BertConfig, BertModel
from bertjax.models.heads import init_params
from bertjax.tasks import base as tasks
from bertjax.training import checkpoints, finetune_config, metrics as metrics_lib, optimizers
from bertjax.training import sharding
from bertjax.training.trainer import Objective, Trainer, batched_outputs
from bertjax.training.trainer import with_shardings

RESULTS_FILE = "eval_results.json"
PREDICTIONS_DIR = "predictions"


def load_encoder(source: checkpoints.ModelSource, layers: int, mesh, rules) -> dict:
    """The checkpoint's `bert` parameters (its first `layers` layers), sharded for `mesh`;
    whatever else it holds (pretraining or task heads) is read and dropped."""
    return load_checkpoint(source, layers, mesh, rules)[0]


def load_checkpoint(source: checkpoints.ModelSource, layers: int, mesh,
                    rules) -> tuple[dict, dict]:
    """(the checkpoint's `bert` parameters, its first `layers` layers, sharded for `mesh`;
    the rest of its parameters by name (pretraining or task heads, a decoder), replicated)."""
    stored = source.param_metadata()
    if "bert" not in stored:
        raise ValueError(f"init_checkpoint {source.params_dir}: its parameters have no 'bert' "
                         f"encoder (found {', '.join(sorted(stored))})")

    boxed = jax.eval_shape(functools.partial(init_params, BertModel(source.config)),
                           jax.random.PRNGKey(0))
    encoder = with_shardings(nn.unbox(boxed), sharding.param_shardings(boxed, mesh, rules))
    other = sharding.replicated(mesh)
    abstract = {name: encoder if name == "bert" else jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=other), tree)
        for name, tree in stored.items()}
    rest = source.load_params(abstract)
    bert = rest.pop("bert")
    kept = {name: layer for name, layer in bert["encoder"].items()
            if not name.startswith("layer_") or int(name[len("layer_"):]) < layers}
    return {**bert, "encoder": kept}, rest


def make_optimizer(opt: Any, total_steps: int):
    """The configured optimizer; head parameters (all but 'bert') move `head_lr_multiplier`
    times as far."""
    warmup = int(opt.warmup_proportion * total_steps)
    schedule = optimizers.learning_rate_schedule(opt.schedule, opt.learning_rate, warmup,
                                                 total_steps)
    tx = optimizers.make_optimizer(opt.name, schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                   weight_decay=opt.weight_decay, clip_norm=opt.clip_norm)
    if opt.head_lr_multiplier != 1.0:
        def head_mask(params):
            return {k: jax.tree.map(lambda _: k != "bert", v) for k, v in params.items()}
        tx = optax.chain(tx, optax.masked(optax.scale(opt.head_lr_multiplier), head_mask))
    return tx, schedule


def objective(model, task: tasks.Task) -> Objective:
    def apply(params, batch, rng):
        if rng is None:  # evaluation: what the task brings back (a generating task decodes)
            return task.infer(model, params, batch)
        return task.forward(model, {"params": params}, batch, deterministic=False,
                            rngs={"dropout": rng})

    def loss(outputs, micro_batch, normalizer):
        loss_sum = task.loss_sum(outputs, micro_batch)
        return loss_sum / normalizer, loss_sum

    return Objective(apply=apply, normalizers=task.normalizer, loss=loss,
                     metrics=lambda value, _: {"loss": value},
                     evaluate=lambda outputs, _: outputs)


def steps_args(config: Any, task: tasks.Task, model, total_steps: int,
               mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """What the run's `Steps` (and so its Trainer) are built from: `task`'s objective on
    `model`, and the optimizer `config` describes over `total_steps`."""
    tx, schedule = make_optimizer(config.optimizer, total_steps)
    return dict(init=functools.partial(init_params, model), objective=objective(model, task),
                tx=tx, schedule=schedule, mesh=mesh, rules=config.mesh.rules,
                global_batch_size=config.train.global_batch_size,
                grad_accum_steps=config.optimizer.grad_accum_steps, seed=config.seed,
                dropout_rng=config.model.dropout_rng)


def training_arrays(config: Any, task: tasks.Task, features) -> tuple[dict, tuple[str, ...]]:
    """The training rows (packed when train.examples_per_row > 1) and the keys a training
    batch holds."""
    arrays, keys = features.arrays, tasks.INPUTS + task.targets
    if config.train.examples_per_row > 1:
        arrays = batching.pack_rows(arrays, task.targets, config.train.examples_per_row)
        keys = tasks.INPUTS + batching.PACKED_ARRAYS + task.targets
    return arrays, keys


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def training_batches(arrays: dict, keys: Sequence[str], batch_size: int, per_epoch: int,
                     seed: int, start_step: int,
                     bucket_lengths: Sequence[int] = ()) -> Iterator[dict]:
    """This process's rows of every batch from `start_step` on: epoch after epoch, each a
    fresh permutation of the training features (the rows that do not fill a batch wait).

    With `bucket_lengths`, each batch is cut to the shortest of them that holds its longest
    example: only padding goes, and the few lengths keep XLA to a few compiled steps. The
    length comes from the whole global batch, so every process cuts its rows alike.
    """
    step = start_step
    while True:
        epoch, offset = divmod(step, per_epoch)
        order = epoch_order(len(arrays["input_ids"]), seed, epoch)
        for offset in range(offset, per_epoch):
            global_rows = order[offset * batch_size:(offset + 1) * batch_size]
            rows = sharding.local_rows(global_rows)
            batch = {k: arrays[k][rows] for k in keys}
            if bucket_lengths:
                global_batch = {batching.MASK: arrays[batching.MASK][global_rows]}
                batch = batching.trim(batch, batching.bucket_length(global_batch,
                                                                    bucket_lengths))
            yield batch
        step = (epoch + 1) * per_epoch


def best_and_final(history: list[dict], metric: str) -> dict:
    """Per evaluation set: its final metrics and the evaluation where `metric` peaked."""
    out = {}
    for record in history:
        entry = out.setdefault(record["set"], {})
        entry["final"] = record
        value = record["metrics"].get(metric)
        if value is not None and ("best" not in entry
                                  or value > entry["best"]["metrics"][metric]):
            entry["best"] = record
    return out


def finetune(config: Any, workdir: str, devices: Sequence[jax.Device] | None = None) -> dict:
    """Fine-tunes as `config` says in `workdir` (resuming from its latest checkpoint).

    Returns {'results': per evaluation set its 'best' and 'final' records, 'step',
    'preempted', 'params'}.
    """
    task = finetune_config.validate(config)
    source = checkpoints.open_model(config.init_checkpoint, config.task.tokenizer)
    cfg = BertConfig.from_config(config.model, source.config)
    if config.task.max_seq_length > cfg.max_position_embeddings:
        raise ValueError(f"task.max_seq_length {config.task.max_seq_length} exceeds the "
                         f"model's max_position_embeddings {cfg.max_position_embeddings}")
    tokenizer = load_tokenizer(source.tokenizer_dir)
    data = task.load(tokenizer)
    # After loading: a task may only know its metric from the data (tagging's tag kind).
    best_metric = config.task.best_metric or task.best_metric
    model = task.model(cfg, data.labels)

    batch_size, train_cfg = config.train.global_batch_size, config.train
    train_arrays, keys = training_arrays(config, task, data.train.features)
    rows = len(train_arrays["input_ids"])
    per_epoch = rows // batch_size
    if per_epoch == 0:
        what = "packed rows" if train_cfg.examples_per_row > 1 else "features"
        raise ValueError(f"the training set has {rows} {what}, fewer than "
                         f"train.global_batch_size {batch_size}")
    total = max(1, round(train_cfg.num_epochs * per_epoch))
    seq_len = config.task.max_seq_length
    if jax.process_index() == 0:
        files.makedirs(workdir)
    mesh = sharding.make_mesh(config.mesh.shape, devices)
    trainer = Trainer(workdir=workdir, keep_checkpoints=train_cfg.keep_checkpoints,
                      **steps_args(config, task, model, total, mesh))
    sharding.check_batch_size(train_cfg.eval_batch_size, trainer.mesh, trainer.rules)

    def initial_params():
        encoder, rest = load_checkpoint(source, cfg.num_hidden_layers, trainer.mesh,
                                        trainer.rules)
        params = task.warm_start({"bert": encoder, **trainer.fresh_params(exclude=("bert",))},
                                 rest)
        params = jax.device_put(params, trainer.param_shardings)  # what warm_start moved
        if jax.process_index() == 0:
            files.write_text(files.path(workdir) / "run_config.json",
                             config.to_json_best_effort(indent=2))
            if data.labels is not None:
                data.labels.save(workdir)
        return params

    host_state = trainer.start(initial_params, train_cfg.restore_fallback) or {}
    history = host_state.get("history", [])
    # A row may hold several sequences (multiple choice: [choices, length]).
    sequences_per_row = int(np.prod(train_arrays["input_ids"].shape[1:-1]))
    flops = metrics_lib.encoder_flops_per_sequence(
        cfg, seq_len, getattr(model, "read_positions", None)) * batch_size * sequences_per_row
    peak = metrics_lib.peak_flops(list(trainer.mesh.devices.flat),
                                  train_cfg.peak_flops_per_device)
    log = metrics_lib.TrainingLog(workdir, total, train_cfg.log_every, batch_size, flops, peak,
                                  config.quiet, host_state.get("window", []))
    log.console.print(trainer.describe(cfg.dtype, peak))

    def evaluate(at: int, sets: list[tasks.TaskSet]) -> None:
        for taskset in sets:
            outputs = batched_outputs(trainer.eval_step, trainer.state.params,
                                      taskset.features.arrays, tasks.INPUTS,
                                      train_cfg.eval_batch_size, trainer.place_rows,
                                      train_cfg.bucket_lengths)
            metrics, records = task.evaluate(taskset, outputs, data.labels)
            if taskset.labelled:
                log.eval_record(at, metrics, prefix=f"eval_{taskset.name}_",
                                heading=f"eval {taskset.name} at step {at} (epoch "
                                        f"{at / per_epoch:g})")
                history.append({"step": at, "epoch": at / per_epoch, "set": taskset.name,
                                "metrics": metrics})
            write_predictions(workdir, taskset.name, records, task)

    def epoch_end(s: int) -> bool:
        return s % per_epoch == 0 or s == total

    try:
        step, preempted = trainer.fit(
            # Packed rows are full: bucket_lengths then only cuts evaluation batches.
            total, training_batches(train_arrays, keys, batch_size, per_epoch, config.seed,
                                    trainer.step, () if train_cfg.examples_per_row > 1
                                    else train_cfg.bucket_lengths),
            log, eval_due=epoch_end, save_due=epoch_end,
            evaluate=lambda at: evaluate(at, data.evals),
            host_state=lambda: {"history": history, "window": log.window},
            profile_steps=train_cfg.profile_steps)
        if trainer.resumed_from == total:  # the run had already finished: report it again
            evaluate(step, data.evals)
        results = best_and_final(history, best_metric)
        if not preempted:
            evaluate(step, data.predicts)
            export(workdir, config, task, cfg, trainer.state.params, tokenizer, data.labels,
                   results, best_metric, step, log)
    finally:
        log.close()
    return {"results": results, "step": step, "preempted": preempted,
            "params": trainer.state.params}


def write_predictions(workdir: str, name: str, records: list[dict], task: tasks.Task) -> None:
    if jax.process_index() != 0:
        return
    directory = files.makedirs(files.path(workdir) / PREDICTIONS_DIR)
    files.write_jsonl(directory / f"{name}.jsonl", records)
    for suffix, obj in task.extra_outputs(records).items():
        files.write_text(directory / f"{name}.{suffix}",
                         json.dumps(obj, ensure_ascii=False, indent=1))


def export(workdir: str, config: Any, task: tasks.Task, cfg: BertConfig, params, tokenizer,
           labels, results: dict, best_metric: str, step: int,
           log: metrics_lib.TrainingLog) -> None:
    """The fine-tuned model directory, the best/final scalars in metrics.jsonl, and
    eval_results.json."""
    model_dir = os.path.join(workdir, checkpoints.MODEL_DIR)
    checkpoints.save_model(model_dir, params, cfg, tokenizer, overwrite=True)
    if jax.process_index() != 0:
        return
    task.save(model_dir, labels)
    summary = {}
    for name, entry in results.items():
        for which in ("best", "final"):
            if which in entry:
                summary.update({f"{which}_{name}_{k}": v
                                for k, v in entry[which]["metrics"].items()
                                if isinstance(v, (int, float))})
    if summary:
        log.writer.write(step, summary)
    files.write_text(files.path(workdir) / RESULTS_FILE, json.dumps(
        {"task": task.name, "best_metric": best_metric, "step": step, "sets": results},
        indent=1))
    log.console.print(f"done: {os.path.join(workdir, RESULTS_FILE)}, model in {model_dir}")


def run(config: Any, workdir: str) -> dict:
    """`config.mode = 'finetune'`: what `python -m bertjax.main` calls."""
    return finetune(config, workdir)
