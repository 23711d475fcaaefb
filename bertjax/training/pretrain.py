"""Pretraining as a client of the trainer: the masked-LM + NSP objective, the input pipeline
and the exported model.

The loss is the original's: the masked-LM cross-entropy averaged over `masked_lm_weights`
(sum(w * CE) / (sum(w) + 1e-5)) plus the mean NSP cross-entropy. Each host feeds its own rows
of every batch from the tf.data pipeline, whose position is saved with every checkpoint so a
resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from bertjax import files
from bertjax.batching import EXAMPLE_WEIGHTS
from bertjax.data import FEATURES, PACKED_FEATURES
from bertjax.models.bert import BertConfig, Packing
from bertjax.models.heads import BertForPreTraining, init_params
from bertjax.training import checkpoints, metrics as metrics_lib, optimizers, pretrain_config
from bertjax.training import sharding
from bertjax.training.trainer import Objective, Trainer

RUN_CONFIG = "run_config.json"  # the run's full config, written when it starts
_MLM_EPS = 1e-5  # the original adds it to the weight total


@dataclasses.dataclass
class PretrainingData:
    """What the loop needs of the input side.

    `train(start_position)` returns an endless iterator of this host's numpy batches (dicts
    keyed by FEATURES) with a `position()` method (a dict of ints) that restores it;
    `eval()` returns the held-out batches, the same ones at every call.
    """

    vocab_size: int
    train: Callable[[dict | None], Iterator[dict[str, np.ndarray]]]
    eval: Callable[[], Iterable[dict[str, np.ndarray]]] | None = None
    tokenizer: Any = None  # saved with the exported model


def pretraining_sums(outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """Sums over a batch from which losses and accuracies follow (so micro-batches add up)."""
    ids_BP = batch["masked_lm_ids"].astype(jnp.int32)
    weights_BP = batch["masked_lm_weights"].astype(jnp.float32)
    logits_BPV = outputs["mlm_logits"]
    ce_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, ids_BP)
    # A hit is the label's logit being the largest. Not argmax == label: argmax is one more
    # pass over the [B, P, V] logits, while this max is the one the cross-entropy already
    # takes (XLA computes it once). They differ only on exact ties.
    label_logit_BP = jnp.take_along_axis(logits_BPV, ids_BP[..., None], -1)[..., 0]
    hit_BP = (label_logit_BP >= jnp.max(logits_BPV, -1)).astype(jnp.float32)
    # Packed rows: one label per example slot, [B, K], weighted 0 at empty slots.
    labels_B = batch["next_sentence_labels"].astype(jnp.int32).reshape(-1)
    nsp_logits_B2 = outputs["nsp_logits"].reshape(-1, 2)
    nsp_weights_B = _sequence_weights(batch)
    return {
        "mlm_loss_sum": jnp.sum(weights_BP * ce_BP),
        "mlm_correct": jnp.sum(weights_BP * hit_BP),
        "mlm_weight": jnp.sum(weights_BP),
        "nsp_loss_sum": jnp.sum(nsp_weights_B * optax.softmax_cross_entropy_with_integer_labels(
            nsp_logits_B2, labels_B)),
        "nsp_correct": jnp.sum(nsp_weights_B * (jnp.argmax(nsp_logits_B2, -1) == labels_B)),
        "sequences": jnp.sum(nsp_weights_B),
    }


def _sequence_weights(batch: dict) -> jax.Array:
    """1 per example (per row, or per filled slot of packed rows), flat."""
    if EXAMPLE_WEIGHTS in batch:
        return batch[EXAMPLE_WEIGHTS].astype(jnp.float32).reshape(-1)
    return jnp.ones(batch["next_sentence_labels"].size, jnp.float32)


def summarize(sums: dict, nsp: bool) -> dict[str, Any]:
    """Losses and accuracies from `pretraining_sums` (device or host values)."""
    out = {"mlm_loss": sums["mlm_loss_sum"] / (sums["mlm_weight"] + _MLM_EPS),
           "mlm_accuracy": sums["mlm_correct"] / (sums["mlm_weight"] + _MLM_EPS)}
    if nsp:
        out["nsp_loss"] = sums["nsp_loss_sum"] / sums["sequences"]
        out["nsp_accuracy"] = sums["nsp_correct"] / sums["sequences"]
    out["loss"] = out["mlm_loss"] + (out["nsp_loss"] if nsp else 0.0)
    return out


def objective(model: BertForPreTraining, nsp: bool) -> Objective:
    def apply(params, batch, rng):
        return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"],
                           deterministic=rng is None, packing=Packing.from_batch(batch),
                           rngs=None if rng is None else {"dropout": rng})

    def normalizers(batch):
        return {"mlm": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + _MLM_EPS,
                "sequences": jnp.sum(_sequence_weights(batch))}

    def loss(outputs, micro_batch, totals):
        sums = pretraining_sums(outputs, micro_batch)
        value = sums["mlm_loss_sum"] / totals["mlm"]
        if nsp:
            value = value + sums["nsp_loss_sum"] / totals["sequences"]
        return value, sums

    return Objective(apply=apply, normalizers=normalizers, loss=loss,
                     metrics=lambda _, sums: summarize(sums, nsp),
                     evaluate=lambda outputs, batch: pretraining_sums(outputs, batch))


def batch_spec(config: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes and dtypes of a global pretraining batch, as the input pipeline makes it
    (tests/test_tpu_plan.py checks them against a real batch): what a plan compiles for."""
    data, rows = config.data, config.train.global_batch_size
    slots, length = data.examples_per_row, data.max_seq_length
    # Packed rows hold P + K prediction slots (data/packing.py: P covers a full row's rate).
    predictions = data.max_predictions_per_seq + (slots if slots > 1 else 0)
    shapes = {"input_ids": (length,), "input_mask": (length,), "segment_ids": (length,),
              "masked_lm_positions": (predictions,), "masked_lm_ids": (predictions,),
              "masked_lm_weights": (predictions,), "next_sentence_labels": ()}
    if slots > 1:
        shapes.update(next_sentence_labels=(slots,), position_ids=(length,),
                      example_ids=(length,), cls_positions=(slots,),
                      example_weights=(slots,))
    floats = ("masked_lm_weights", "example_weights")
    return {name: jax.ShapeDtypeStruct((rows, *shape),
                                       jnp.float32 if name in floats else jnp.int32)
            for name, shape in shapes.items()}


def steps_args(config: Any, cfg: BertConfig, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """What the run's `Steps` (and so its Trainer) are built from: the model, objective and
    optimizer that `config` describes, for model `cfg` on `mesh`."""
    model = BertForPreTraining(cfg)
    opt, train_cfg = config.optimizer, config.train
    schedule = optimizers.learning_rate_schedule(opt.schedule, opt.learning_rate,
                                                 opt.warmup_steps, train_cfg.num_steps)
    tx = optimizers.make_optimizer(opt.name, schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                   weight_decay=opt.weight_decay, clip_norm=opt.clip_norm)
    return dict(init=functools.partial(init_params, model),
                objective=objective(model, config.data.nsp), tx=tx, schedule=schedule,
                mesh=mesh, rules=config.mesh.rules,
                global_batch_size=train_cfg.global_batch_size,
                grad_accum_steps=opt.grad_accum_steps, seed=config.seed,
                dropout_rng=config.model.dropout_rng)


def evaluates(config: Any) -> bool:
    """Whether the run evaluates on held-out batches as it trains."""
    return config.train.evaluate


def _gather_positions(position: dict) -> list[dict]:
    """Every process's data position (a dict of ints), on every process."""
    keys = sorted(position)
    values = np.asarray([int(position[k]) for k in keys], np.int64)
    if jax.process_count() == 1:
        return [dict(zip(keys, values.tolist()))]
    rows = np.asarray(multihost_utils.process_allgather(values)).reshape(jax.process_count(), -1)
    return [dict(zip(keys, row.tolist())) for row in rows]


def _features(local: dict) -> dict:
    missing = [f for f in FEATURES if f not in local]
    if missing:
        raise ValueError(f"input batch lacks features {missing}; expected {FEATURES}")
    return {f: local[f] for f in FEATURES + PACKED_FEATURES if f in local}


def _batches(iterator) -> Iterator[dict]:
    while True:
        yield _features(next(iterator))


def train(config: Any, workdir: str, data: PretrainingData,
          devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
    """Pretrains as `config` says in `workdir`, resuming from its latest checkpoint.

    `devices` defaults to all. Returns {'state': the final TrainState, 'step': the step
    reached, 'preempted': whether SIGTERM stopped it}. At the end the parameters are also
    exported as a model directory, WORKDIR/model. Raises FloatingPointError when the loss
    stops being finite (the last good checkpoint is kept).
    """
    pretrain_config.validate(config)
    train_cfg = config.train
    evaluating = data.eval is not None and evaluates(config)
    if evaluating:
        data.eval()  # built now, so an empty held-out split fails here, not hours later
    if jax.process_index() == 0:
        files.makedirs(workdir)
    cfg = BertConfig.from_config(config.model, vocab_size=data.vocab_size)
    seq_len, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    mesh = sharding.make_mesh(config.mesh.shape, devices)
    trainer = Trainer(workdir=workdir, keep_checkpoints=train_cfg.keep_checkpoints,
                      **steps_args(config, cfg, mesh))

    def initial_params():
        if jax.process_index() == 0:
            files.write_text(files.path(workdir) / RUN_CONFIG,
                             config.to_json_best_effort(indent=2))
            checkpoints.write_architecture(workdir, cfg, data.tokenizer)
        if config.init_checkpoint:
            return checkpoints.open_model(config.init_checkpoint).load_params(
                trainer.abstract_params)
        return trainer.fresh_params()

    host_state = trainer.start(initial_params, train_cfg.restore_fallback) or {}
    if host_state and host_state["process_count"] != jax.process_count():
        raise ValueError(
            f"checkpoint step {trainer.resumed_from} in {trainer.checkpoints.directory} was "
            f"written by {host_state['process_count']} processes and this run has "
            f"{jax.process_count()}: each process's data position would not match. Resume "
            f"with the same number of hosts, or start a new workdir with "
            f"--config.init_checkpoint={workdir}")

    positions = host_state.get("data_positions")
    iterator = data.train(positions[jax.process_index()] if positions else None)
    batch_size = train_cfg.global_batch_size
    flops = metrics_lib.pretraining_flops_per_sequence(cfg, seq_len, predictions) * batch_size
    peak = metrics_lib.peak_flops(list(trainer.mesh.devices.flat),
                                  train_cfg.peak_flops_per_device)
    log = metrics_lib.TrainingLog(workdir, train_cfg.num_steps, train_cfg.log_every,
                                  batch_size, flops, peak, config.quiet,
                                  host_state.get("window", []))
    log.console.print(trainer.describe(cfg.dtype, peak))

    def evaluate(at: int) -> None:
        totals = None
        for local in data.eval():
            sums = jax.device_get(trainer.eval_step(trainer.state.params,
                                                    trainer.global_batch(_features(local))))
            totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
        if totals is not None:
            log.eval_record(at, {k: float(v)
                                 for k, v in summarize(totals, config.data.nsp).items()})

    try:
        step, preempted = trainer.fit(
            train_cfg.num_steps, _batches(iterator), log,
            eval_due=lambda s: bool(evaluating) and s % train_cfg.eval_every == 0,
            save_due=lambda s: s % train_cfg.checkpoint_every == 0, evaluate=evaluate,
            host_state=lambda: {"data_positions": _gather_positions(iterator.position()),
                                "window": log.window, "process_count": jax.process_count()},
            profile_steps=train_cfg.profile_steps)
    finally:
        log.close()
    if not preempted and step == train_cfg.num_steps:
        checkpoints.save_model(str(files.path(workdir) / checkpoints.MODEL_DIR),
                               trainer.state.params, cfg, data.tokenizer, overwrite=True)
    return {"state": trainer.state, "step": step, "preempted": preempted}


def input_data(config: Any) -> PretrainingData:
    """The tf.data pipelines `config.data` describes, for this process's share of each batch."""
    from bertjax.data import pretraining, tokenizers

    data = config.data
    if not data.shard_dir:
        raise ValueError("config.data.shard_dir is not set: set it to the output of "
                         "`python -m bertjax.prepare` (--config.data.shard_dir=DIR)")
    from bertjax.data import shards
    shards.read_manifest(data.shard_dir)  # a clear error for a missing or unfinished corpus
    tokenizer = tokenizers.load_tokenizer(data.shard_dir)
    vocab = pretraining.Vocab.from_tokenizer(tokenizer)
    recipe = dict(vocab=vocab, max_seq_length=data.max_seq_length,
                  max_predictions_per_seq=data.max_predictions_per_seq,
                  global_batch_size=config.train.global_batch_size, seed=config.seed,
                  mask_rate=data.mask_rate, mask_prob=data.mask_prob,
                  random_prob=data.random_prob, whole_word_masking=data.whole_word_masking,
                  nsp=data.nsp, short_seq_prob=data.short_seq_prob,
                  shuffle_tokens=data.shuffle_tokens, examples_per_row=data.examples_per_row,
                  process_index=jax.process_index(), process_count=jax.process_count())
    heldout = 0.0 if data.eval_shard_dir else data.heldout_fraction

    def train_iterator(start_position):
        return pretraining.pretraining_dataset(data.shard_dir, heldout_fraction=heldout,
                                               start_position=start_position, **recipe)

    eval_batches = None
    if evaluates(config) and (data.eval_shard_dir or heldout > 0):
        cache: list = []

        def eval_batches():
            # Built once and kept: the same held-out batches at every evaluation.
            if not cache:
                cache.extend(pretraining.eval_dataset(
                    data.eval_shard_dir or data.shard_dir, heldout_fraction=heldout,
                    num_batches=config.train.eval_batches, **recipe))
            return cache

    return PretrainingData(vocab_size=tokenizer.vocab_size, train=train_iterator,
                           eval=eval_batches, tokenizer=tokenizer)


def run(config: Any, workdir: str) -> dict:
    """`config.mode = 'pretrain'`: what `python -m bertjax.main` calls."""
    return train(config, workdir, input_data(config))
