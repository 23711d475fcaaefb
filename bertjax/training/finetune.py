"""Fine-tuning: one loop for every task head (classification, regression, tagging, SQuAD).

The encoder comes from `init_checkpoint` (a model directory or a pretraining workdir), the
head starts fresh. The pretraining side's pieces are reused as they are: the mesh and
shardings, the optimizers and schedules, gradient accumulation, run checkpoints (resume,
preemption) and the metric writers. Each process reads the whole (small) task data and feeds
its own rows of every global batch; the training order is a permutation per epoch from
(seed, epoch), so a resumed run sees the batches an uninterrupted one would.

After every epoch (and at the end) each evaluation set is scored; metrics go to
WORKDIR/metrics.jsonl and TensorBoard, predictions to WORKDIR/predictions/<set>.jsonl, and at
the end the best and final metrics to WORKDIR/eval_results.json. The fine-tuned model is
exported to WORKDIR/model (model directory + task.json + labels.json) for `bertjax.predict`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from etils import epath

from bertjax.data.features import LabelVocab
from bertjax.data.tokenizers import load_tokenizer
from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining
from bertjax.training import (checkpoints, metrics as metrics_lib, optimizers, pretrain,
                              sharding, task_inputs, task_types)
from bertjax.training.task_predict import TASK_FILE
from bertjax.training.pretrain import TrainState

MODEL_DIR = "model"
RESULTS_FILE = "eval_results.json"
PREDICTIONS_DIR = "predictions"
TASK_KEYS = ("type", "max_seq_length", "doc_stride", "max_query_length", "n_best",
             "max_answer_length", "version_2", "null_threshold", "tag_scheme")


# --- the encoder to start from ---------------------------------------------------------------


def checkpoint_config(path: str, tokenizer_path: str = "") -> tuple[BertConfig, str]:
    """(model config, tokenizer path) of a model directory or a pretraining workdir."""
    if checkpoints.is_run_directory(path):
        run_config = epath.Path(path) / pretrain.RUN_CONFIG
        if not run_config.exists():
            raise FileNotFoundError(f"init_checkpoint {path}: a pretraining workdir without "
                                    f"{pretrain.RUN_CONFIG}")
        run = json.loads(run_config.read_text())
        tokenizer_path = tokenizer_path or run["data"]["shard_dir"]
        vocab_size = load_tokenizer(tokenizer_path).vocab_size
        config = pretrain.model_config(ml_collections.ConfigDict(run["model"]), vocab_size)
        return config, tokenizer_path
    if not path:
        raise ValueError("init_checkpoint is empty: set it to a model directory (python -m "
                         "bertjax.convert output) or a pretraining workdir")
    return checkpoints.load_model_config(path), tokenizer_path or path


def task_model_config(base: BertConfig, model: Any) -> BertConfig:
    """The checkpoint's architecture with the fine-tuning run's dropout, dtype and depth."""
    layers = model.num_hidden_layers or base.num_hidden_layers
    if not 0 < layers <= base.num_hidden_layers:
        raise ValueError(f"model.num_hidden_layers {model.num_hidden_layers}: the checkpoint "
                         f"has {base.num_hidden_layers} layers")
    if model.dtype not in pretrain.DTYPES:
        raise ValueError(f"model.dtype {model.dtype!r}: expected one of "
                         f"{', '.join(pretrain.DTYPES)}")
    return dataclasses.replace(
        base, num_hidden_layers=layers, hidden_dropout_prob=model.hidden_dropout_prob,
        attention_probs_dropout_prob=model.attention_probs_dropout_prob, remat=model.remat,
        dtype=pretrain.DTYPES[model.dtype])


def load_encoder(path: str, base: BertConfig, layers: int, mesh, rules) -> dict:
    """The checkpoint's `bert` parameters (its first `layers` layers), sharded for `mesh`."""
    def init(key):
        ids = jnp.zeros((1, 8), jnp.int32)
        return BertForPreTraining(base).init(key, ids, ids, ids, jnp.zeros((1, 1), jnp.int32))

    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))["params"]
    abstract = _with_shardings(nn.unbox(boxed), sharding.param_shardings(boxed, mesh, rules))
    bert = checkpoints.load_initial_params(path, abstract)["bert"]
    encoder = {name: layer for name, layer in bert["encoder"].items()
               if not name.startswith("layer_") or int(name[len("layer_"):]) < layers}
    return {**bert, "encoder": encoder}


def _with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


# --- steps -----------------------------------------------------------------------------------


def _apply(model, params, batch, deterministic: bool, rng=None):
    return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], deterministic=deterministic,
                       rngs=None if deterministic else {"dropout": rng})


def make_train_step(model: nn.Module, kind: task_types.TaskType,
                    tx: optax.GradientTransformation, schedule, grad_accum_steps: int):
    def train_step(state: TrainState, batch: dict, rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        normalizer = kind.normalizer(batch)

        def loss_fn(params, micro_batch, index):
            outputs = _apply(model, params, micro_batch, False, jax.random.fold_in(step_rng, index))
            loss_sum = kind.loss_sum(outputs, micro_batch)
            return loss_sum / normalizer, loss_sum

        (loss, _), grads = optimizers.accumulate_gradients(loss_fn, state.params, batch,
                                                           grad_accum_steps)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(state.step + 1, params, opt_state), {
            "loss": loss, "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state.step)}

    return train_step


def make_eval_step(model: nn.Module, kind: task_types.TaskType):
    def eval_step(params, batch: dict):
        return kind.fetch(_apply(model, params, batch, True))
    return eval_step


def make_optimizer(opt: Any, total_steps: int):
    """The configured optimizer; head parameters (all but 'bert') move `head_lr_multiplier`
    times as far."""
    warmup = int(opt.warmup_proportion * total_steps)
    schedule = optimizers.learning_rate_schedule(opt.schedule, opt.learning_rate, warmup,
                                                 total_steps)
    tx = optimizers.make_optimizer(opt.name, schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                   weight_decay=opt.weight_decay, clip_norm=opt.clip_norm)
    if opt.head_lr_multiplier <= 0:
        raise ValueError(f"optimizer.head_lr_multiplier {opt.head_lr_multiplier}: expected > 0")
    if opt.head_lr_multiplier != 1.0:
        def head_mask(params):
            return {k: jax.tree.map(lambda _: k != "bert", v) for k, v in params.items()}
        tx = optax.chain(tx, optax.masked(optax.scale(opt.head_lr_multiplier), head_mask))
    return tx, schedule


# --- feeding batches -------------------------------------------------------------------------


def _local_rows(global_rows: np.ndarray) -> np.ndarray:
    share = len(global_rows) // jax.process_count()
    return global_rows[jax.process_index() * share:(jax.process_index() + 1) * share]


def _batch(arrays: dict, rows: np.ndarray, keys: Sequence[str], batch_sh, size: int) -> dict:
    local = _local_rows(rows)
    return sharding.make_global_batch({k: arrays[k][local] for k in keys}, batch_sh, size)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def predict_outputs(eval_step, params, arrays: dict, batch_sh, batch_size: int):
    """Eval-step outputs for every row of `arrays` (the last batch padded, then cut)."""
    n = len(arrays["input_ids"])
    rows = np.concatenate([np.arange(n), np.zeros(-n % batch_size, np.int64)])
    outputs = []
    for start in range(0, len(rows), batch_size):
        batch = _batch(arrays, rows[start:start + batch_size], task_types.INPUTS, batch_sh,
                       batch_size)
        outputs.append(jax.device_get(eval_step(params, batch)))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *outputs)


# --- the run ---------------------------------------------------------------------------------


class _Reporter:
    """Training lines and records, evaluation records, predictions files, results."""

    def __init__(self, workdir: str, total: int, log_every: int, quiet: bool, history: list):
        self.workdir, self.total, self.log_every = workdir, total, log_every
        self.writer = metrics_lib.MetricWriter(workdir)
        self.console = metrics_lib.Console(quiet)
        self.primary = jax.process_index() == 0
        self.history = history  # evaluation records so far; saved with checkpoints
        self.window: list[dict] = []
        self._clock = (0, time.perf_counter())

    def restart_clock(self, step: int) -> None:
        self._clock = (step, time.perf_counter())

    def train_record(self, step: int, device_metrics: dict) -> None:
        host = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
        if not math.isfinite(host["loss"]):
            raise FloatingPointError(f"fine-tuning diverged: loss {host['loss']} at step {step};"
                                     f" lower optimizer.learning_rate")
        self.window.append(host)
        if step % self.log_every and step != self.total:
            return
        record = metrics_lib.mean_metrics(self.window)
        self.window.clear()
        done, started = step - self._clock[0], self._clock[1]
        rate = done / max(time.perf_counter() - started, 1e-9)
        self.restart_clock(step)
        self.writer.write(step, record)
        self.console.print(f"step {step}/{self.total} | loss {record['loss']:.4f} | lr "
                           f"{record['learning_rate']:.2e} | {rate:.2f} steps/s | ETA "
                           f"{metrics_lib.format_duration((self.total - step) / rate)}")

    def eval_record(self, step: int, epoch: float, name: str, metrics: dict) -> None:
        self.writer.write(step, {f"eval_{name}_{k}": v for k, v in metrics.items()
                                 if isinstance(v, (int, float))})
        self.history.append({"step": step, "epoch": epoch, "set": name, "metrics": metrics})
        self.console.print(f"eval {name} at step {step} (epoch {epoch:g}): " + " | ".join(
            f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)))

    def predictions(self, name: str, records: list[dict], answers: dict | None = None) -> None:
        if not self.primary:
            return
        directory = epath.Path(self.workdir) / PREDICTIONS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        metrics_lib.write_text_atomic(directory / f"{name}.jsonl", "".join(
            json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        if answers is not None:  # SQuAD's official format: {question id: answer}
            metrics_lib.write_text_atomic(directory / f"{name}.answers.json",
                                          json.dumps(answers, ensure_ascii=False, indent=1))

    def close(self) -> None:
        self.writer.close()


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
    kind = task_types.task_type(config.task.type)
    best_metric = config.task.best_metric or kind.best_metric
    if best_metric not in kind.higher_is_better:
        raise ValueError(f"task.best_metric {best_metric!r}: for {config.task.type} expected one "
                         f"of {', '.join(kind.higher_is_better)}")
    base, tokenizer_path = checkpoint_config(config.init_checkpoint, config.task.tokenizer)
    cfg = task_model_config(base, config.model)
    if config.task.max_seq_length > cfg.max_position_embeddings:
        raise ValueError(f"task.max_seq_length {config.task.max_seq_length} exceeds the "
                         f"model's max_position_embeddings {cfg.max_position_embeddings}")
    tokenizer = load_tokenizer(tokenizer_path)
    data = task_inputs.load_task_data(config.task, tokenizer)
    model = kind.model(cfg, data.labels)

    batch_size = config.train.global_batch_size
    per_epoch = len(data.train.features) // batch_size
    if per_epoch == 0:
        raise ValueError(f"the training set has {len(data.train.features)} features, fewer "
                         f"than train.global_batch_size {batch_size}")
    total = max(1, round(config.train.num_epochs * per_epoch))
    mesh = sharding.make_mesh(config.mesh.shape, devices)
    rules = sharding.check_rules(config.mesh.rules)
    sharding.check_batch_size(batch_size, mesh, rules, config.optimizer.grad_accum_steps)
    sharding.check_batch_size(config.train.eval_batch_size, mesh, rules)
    tx, schedule = make_optimizer(config.optimizer, total)

    seq_len = config.task.max_seq_length

    def init(key):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        return model.init(key, ids, ids, ids)["params"]

    root = jax.random.PRNGKey(config.seed)
    init_key, dropout_key = jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)
    boxed = jax.eval_shape(init, init_key)
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    abstract_params = nn.unbox(boxed)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_sh = sharding.optimizer_shardings(tx, abstract_opt, param_sh, mesh)
    repl = sharding.replicated(mesh)
    state_sh = TrainState(repl, param_sh, opt_sh)
    batch_sh = sharding.batch_sharding(mesh, rules)
    if jax.process_index() == 0:
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)

    ckpt = checkpoints.RunCheckpoints(workdir, config.train.keep_checkpoints)
    latest = ckpt.latest_step()
    history: list = []
    if latest is not None:
        restored = ckpt.restore(
            latest, abstract_params=_with_shardings(abstract_params, param_sh),
            abstract_opt_state=_with_shardings(abstract_opt, opt_sh),
            abstract_progress={"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=repl),
                               "rng": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=repl)})
        state = TrainState(restored["progress"]["step"], restored["params"],
                           restored["opt_state"])
        dropout_key = restored["progress"]["rng"]
        history = restored["host"]["history"]
        metrics_lib.truncate_jsonl(workdir, latest)
    else:
        head = jax.jit(lambda k: {n: p for n, p in nn.unbox(init(k)).items() if n != "bert"},
                       out_shardings={n: s for n, s in param_sh.items() if n != "bert"})(init_key)
        params = {"bert": load_encoder(config.init_checkpoint, base, cfg.num_hidden_layers,
                                       mesh, rules), **head}
        opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
        state = TrainState(jax.device_put(jnp.zeros((), jnp.int32), repl), params, opt_state)
        dropout_key = jax.device_put(dropout_key, repl)
        if jax.process_index() == 0:
            metrics_lib.write_text_atomic(epath.Path(workdir) / pretrain.RUN_CONFIG,
                                          config.to_json_best_effort(indent=2))
            if data.labels is not None:
                data.labels.save(workdir)

    train_step = jax.jit(make_train_step(model, kind, tx, schedule,
                                         config.optimizer.grad_accum_steps),
                         in_shardings=(state_sh, batch_sh, repl),
                         out_shardings=(state_sh, repl), donate_argnums=(0,))
    eval_step = jax.jit(make_eval_step(model, kind), in_shardings=(param_sh, batch_sh),
                        out_shardings=repl)
    reporter = _Reporter(workdir, total, config.train.log_every, config.quiet, history)
    keys = task_types.INPUTS + kind.targets
    arrays = data.train.features.arrays
    step = int(jax.device_get(state.step))
    if latest is not None:
        reporter.console.print(f"resumed from step {latest} ({ckpt.directory})")

    def evaluate(at: int, sets) -> None:
        for taskset in sets:
            outputs = predict_outputs(eval_step, state.params, taskset.features.arrays,
                                      batch_sh, config.train.eval_batch_size)
            metrics, records = kind.evaluate(config.task, taskset, outputs, data.labels)
            if taskset.labelled:
                reporter.eval_record(at, at / per_epoch, taskset.name, metrics)
            answers = ({r["id"]: r["prediction"] for r in records}
                       if config.task.type == "squad" else None)
            reporter.predictions(taskset.name, records, answers)

    def save(at: int) -> None:
        ckpt.save(at, params=state.params, opt_state=state.opt_state,
                  progress={"step": state.step, "rng": dropout_key},
                  host={"history": reporter.history})

    preempted, pending, order = False, None, (-1, None)
    try:
        try:
            while step < total:
                epoch, offset = divmod(step, per_epoch)
                if order[0] != epoch:
                    order = (epoch, epoch_order(len(arrays["input_ids"]), config.seed, epoch))
                batch = _batch(arrays, order[1][offset * batch_size:(offset + 1) * batch_size],
                               keys, batch_sh, batch_size)
                state, step_metrics = train_step(state, batch, dropout_key)
                step += 1
                if pending is not None:
                    reporter.train_record(*pending)
                pending = (step, step_metrics)
                preempted = ckpt.preemption_requested(step)
                epoch_end = step % per_epoch == 0 or step == total
                if epoch_end or preempted:
                    reporter.train_record(*pending)
                    pending = None
                    save(step)
                    if epoch_end:
                        evaluate(step, data.evals)
                    reporter.restart_clock(step)
                if preempted:
                    reporter.console.print(f"SIGTERM: saved step {step} in {ckpt.directory}; "
                                           "run the same command again to resume")
                    break
            if pending is not None:
                reporter.train_record(*pending)
        finally:
            ckpt.close()
        if latest == total:  # the run had already finished: report its results again
            evaluate(step, data.evals)
        results = best_and_final(reporter.history, best_metric)
        if not preempted:
            evaluate(step, data.predicts)
            _finish(workdir, config, cfg, state.params, tokenizer, data.labels, results,
                    best_metric, step, reporter)
    finally:
        reporter.close()
    return {"results": results, "step": step, "preempted": preempted, "params": state.params}


def _finish(workdir, config, cfg, params, tokenizer, labels: LabelVocab | None, results,
            best_metric: str, step: int, reporter: _Reporter) -> None:
    """The exported model, the best/final scalars in metrics.jsonl, eval_results.json."""
    model_dir = os.path.join(workdir, MODEL_DIR)
    checkpoints.save_model(model_dir, params, cfg, tokenizer, overwrite=True)
    if jax.process_index() != 0:
        return
    task = {k: config.task[k] for k in TASK_KEYS}
    metrics_lib.write_text_atomic(epath.Path(model_dir) / TASK_FILE, json.dumps(task, indent=1))
    if labels is not None:
        labels.save(model_dir)
    summary = {}
    for name, entry in results.items():
        for which in ("best", "final"):
            if which in entry:
                summary.update({f"{which}_{name}_{k}": v
                                for k, v in entry[which]["metrics"].items()
                                if isinstance(v, (int, float))})
    if summary:
        reporter.writer.write(step, summary)
    metrics_lib.write_text_atomic(
        epath.Path(workdir) / RESULTS_FILE,
        json.dumps({"task": config.task.type, "best_metric": best_metric, "step": step,
                    "sets": results}, indent=1))
    reporter.console.print(f"done: {os.path.join(workdir, RESULTS_FILE)}, model in {model_dir}")


def run(config: Any, workdir: str) -> None:
    """`config.mode = 'finetune'`: what `python -m bertjax.main` calls."""
    finetune(config, workdir)
