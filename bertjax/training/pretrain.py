"""Pretraining: the pure train and eval steps, jitted with shardings, and the loop around them.

`train_step(state, batch, rng) -> (state, metrics)` computes the masked-LM loss (weighted
mean cross-entropy over `masked_lm_weights`, as the original) plus the NSP loss, accumulates
gradients over micro-batches with one optimizer update per step, and is jitted once with
in/out shardings and the state donated. The loop feeds it global batches built from each
host's rows, fetches metrics one step late so the host never stalls the devices, evaluates,
checkpoints (and resumes) with the data position, and stops cleanly on SIGTERM or a
non-finite loss.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from jax.experimental import multihost_utils

from bertjax.models import presets
from bertjax.models.bert import BertConfig, Embeddings
from bertjax.models.heads import BertForPreTraining
from bertjax.training import checkpoints, metrics as metrics_lib, optimizers, sharding

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
MODEL_DIR = "model"  # the model directory exported into the workdir at the end
RUN_CONFIG = "run_config.json"  # the run's full config, written when it starts
_MLM_EPS = 1e-5  # the original adds it to the weight total


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


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


def model_config(model: Any, vocab_size: int) -> BertConfig:
    """The BertConfig of `config.model`; `vocab_size` is the tokenizer's."""
    if model.dtype not in DTYPES:
        raise ValueError(f"model.dtype {model.dtype!r}: expected one of {', '.join(DTYPES)}")
    if model.vocab_size and model.vocab_size < vocab_size:
        raise ValueError(f"model.vocab_size {model.vocab_size} is smaller than the tokenizer's "
                         f"vocabulary ({vocab_size})")
    sizes = {k: getattr(model, k) for k in ("num_hidden_layers", "hidden_size",
                                            "num_attention_heads", "intermediate_size")
             if getattr(model, k)}
    return presets.preset(
        model.size, **sizes, vocab_size=model.vocab_size or vocab_size,
        hidden_act=model.hidden_act, max_position_embeddings=model.max_position_embeddings,
        hidden_dropout_prob=model.hidden_dropout_prob,
        attention_probs_dropout_prob=model.attention_probs_dropout_prob,
        pre_layer_norm=model.pre_layer_norm, remat=model.remat, dtype=DTYPES[model.dtype])


def pretraining_sums(outputs: dict, batch: dict) -> dict[str, jax.Array]:
    """Sums over a batch from which losses and accuracies follow (so micro-batches add up)."""
    ids_BP = batch["masked_lm_ids"].astype(jnp.int32)
    weights_BP = batch["masked_lm_weights"].astype(jnp.float32)
    logits_BPV = outputs["mlm_logits"]
    ce_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, ids_BP)
    hit_BP = (jnp.argmax(logits_BPV, -1) == ids_BP).astype(jnp.float32)
    labels_B = batch["next_sentence_labels"].astype(jnp.int32).reshape(-1)
    nsp_logits_B2 = outputs["nsp_logits"]
    return {
        "mlm_loss_sum": jnp.sum(weights_BP * ce_BP),
        "mlm_correct": jnp.sum(weights_BP * hit_BP),
        "mlm_weight": jnp.sum(weights_BP),
        "nsp_loss_sum": jnp.sum(
            optax.softmax_cross_entropy_with_integer_labels(nsp_logits_B2, labels_B)),
        "nsp_correct": jnp.sum((jnp.argmax(nsp_logits_B2, -1) == labels_B).astype(jnp.float32)),
        "sequences": jnp.asarray(labels_B.shape[0], jnp.float32),
    }


def summarize(sums: dict, nsp: bool) -> dict[str, Any]:
    """Losses and accuracies from `pretraining_sums` (device or host values)."""
    out = {"mlm_loss": sums["mlm_loss_sum"] / (sums["mlm_weight"] + _MLM_EPS),
           "mlm_accuracy": sums["mlm_correct"] / (sums["mlm_weight"] + _MLM_EPS)}
    if nsp:
        out["nsp_loss"] = sums["nsp_loss_sum"] / sums["sequences"]
        out["nsp_accuracy"] = sums["nsp_correct"] / sums["sequences"]
    out["loss"] = out["mlm_loss"] + (out["nsp_loss"] if nsp else 0.0)
    return out


def _decoder_input_constraint(activation_sharding):
    """Pins the MLM decoder's input [B, P, D] to batch sharding with whole features.

    Without it XLA's SPMD partitioner (jaxlib 0.10.2, both Shardy and GSPMD) computes wrong
    gradients for the MLM transform and LayerNorm on meshes with data, fsdp and tensor all
    > 1 (the forward pass is right). It is the layout the partitioner picks anyway elsewhere.
    """
    def interceptor(next_fun, args, kwargs, context):
        if isinstance(context.module, Embeddings) and context.method_name == "attend":
            args = (jax.lax.with_sharding_constraint(args[0], activation_sharding),) + args[1:]
        return next_fun(*args, **kwargs)
    return interceptor


def _apply(model: nn.Module, params, batch: dict, deterministic: bool, rng=None,
           activation_sharding=None) -> dict:
    def call():
        return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"],
                           deterministic=deterministic,
                           rngs=None if deterministic else {"dropout": rng})
    if activation_sharding is None:
        return call()
    with nn.intercept_methods(_decoder_input_constraint(activation_sharding)):
        return call()


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, *, grad_accum_steps: int, nsp: bool,
                    activation_sharding=None):
    """The pure train step. Losses are normalised by the whole batch's totals, so
    accumulating micro-batch gradients gives the full batch's gradient.
    `activation_sharding` is the batch sharding, for activations the step pins."""

    def train_step(state: TrainState, batch: dict, rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        mlm_total = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + _MLM_EPS
        sequences = batch["input_ids"].shape[0]

        def loss_fn(params, micro_batch, index):
            outputs = _apply(model, params, micro_batch, False,
                             jax.random.fold_in(step_rng, index), activation_sharding)
            sums = pretraining_sums(outputs, micro_batch)
            loss = sums["mlm_loss_sum"] / mlm_total
            if nsp:
                loss = loss + sums["nsp_loss_sum"] / sequences
            return loss, sums

        (_, sums), grads = optimizers.accumulate_gradients(loss_fn, state.params, batch,
                                                           grad_accum_steps)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step_metrics = {**summarize(sums, nsp), "grad_norm": optax.tree.norm(grads),
                        "learning_rate": schedule(state.step)}
        return TrainState(state.step + 1, params, opt_state), step_metrics

    return train_step


def make_eval_step(model: nn.Module, activation_sharding=None):
    def eval_step(params, batch: dict) -> dict:
        return pretraining_sums(_apply(model, params, batch, True, None, activation_sharding),
                                batch)
    return eval_step


def _with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def _gather_positions(position: dict) -> list[dict]:
    """Every process's data position (a dict of ints), on every process."""
    keys = sorted(position)
    values = np.asarray([int(position[k]) for k in keys], np.int64)
    if jax.process_count() == 1:
        return [dict(zip(keys, values.tolist()))]
    rows = np.asarray(multihost_utils.process_allgather(values)).reshape(jax.process_count(), -1)
    return [dict(zip(keys, row.tolist())) for row in rows]


def _check_train_config(train: Any) -> None:
    for key in ("global_batch_size", "num_steps", "log_every", "checkpoint_every",
                "keep_checkpoints"):
        if getattr(train, key) <= 0:
            raise ValueError(f"train.{key} is {getattr(train, key)}: expected a positive number")
    if train.eval_every < 0 or train.eval_batches < 0:
        raise ValueError("train.eval_every and train.eval_batches must be >= 0")


def _restore(ckpt: checkpoints.RunCheckpoints, step: int, abstract_params, tx, opt_sh, repl,
             workdir: str):
    """(state, dropout key, host state) of checkpoint `step`, placed as the run shards them."""
    abstract_opt = _with_shardings(jax.eval_shape(tx.init, abstract_params), opt_sh)
    restored = ckpt.restore(
        step, abstract_params=abstract_params, abstract_opt_state=abstract_opt,
        abstract_progress={"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=repl),
                           "rng": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=repl)})
    host_state = restored["host"]
    if host_state["process_count"] != jax.process_count():
        raise ValueError(
            f"checkpoint step {step} in {ckpt.directory} was written by "
            f"{host_state['process_count']} processes and this run has {jax.process_count()}: "
            "each process's data position would not match. Resume with the same number of "
            f"hosts, or start a new workdir with --config.init_checkpoint={workdir}")
    metrics_lib.truncate_jsonl(workdir, step)
    state = TrainState(restored["progress"]["step"], restored["params"], restored["opt_state"])
    return state, restored["progress"]["rng"], host_state


def train(config: Any, workdir: str, data: PretrainingData,
          devices: Sequence[jax.Device] | None = None) -> dict[str, Any]:
    """Pretrains as `config` says in `workdir`, resuming from its latest checkpoint.

    `devices` defaults to all. Returns {'state': the final TrainState, 'step': the step
    reached, 'preempted': whether SIGTERM stopped it}. At the end the parameters are also
    exported as a model directory, WORKDIR/model. Raises FloatingPointError when the loss
    stops being finite (the last good checkpoint is kept).
    """
    _check_train_config(config.train)
    if jax.process_index() == 0:
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    cfg = model_config(config.model, data.vocab_size)
    seq_len, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    if seq_len > cfg.max_position_embeddings:
        raise ValueError(f"data.max_seq_length {seq_len} exceeds model.max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    batch_size, accum = config.train.global_batch_size, config.optimizer.grad_accum_steps
    mesh = sharding.make_mesh(config.mesh.shape, devices)
    rules = sharding.check_rules(config.mesh.rules)
    sharding.check_batch_size(batch_size, mesh, rules, accum)

    model = BertForPreTraining(cfg)
    opt = config.optimizer
    schedule = optimizers.learning_rate_schedule(opt.schedule, opt.learning_rate,
                                                 opt.warmup_steps, config.train.num_steps)
    tx = optimizers.make_optimizer(opt.name, schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                   weight_decay=opt.weight_decay, clip_norm=opt.clip_norm)

    def init_params(key):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        positions = jnp.zeros((1, predictions), jnp.int32)
        return model.init(key, ids, ids, ids, positions)["params"]

    root = jax.random.PRNGKey(config.seed)
    init_key, dropout_key = jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)
    boxed = jax.eval_shape(init_params, init_key)
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    abstract_params = _with_shardings(nn.unbox(boxed), param_sh)
    opt_sh = sharding.optimizer_shardings(tx, jax.eval_shape(tx.init, abstract_params),
                                          param_sh, mesh)
    repl = sharding.replicated(mesh)
    state_sh = TrainState(repl, param_sh, opt_sh)
    batch_sh = sharding.batch_sharding(mesh, rules)

    ckpt = checkpoints.RunCheckpoints(workdir, config.train.keep_checkpoints)
    latest = ckpt.latest_step()
    if latest is not None:
        state, dropout_key, host_state = _restore(ckpt, latest, abstract_params, tx, opt_sh,
                                                  repl, workdir)
    else:
        if config.init_checkpoint:
            params = checkpoints.load_initial_params(config.init_checkpoint, abstract_params)
        else:
            params = jax.jit(lambda k: nn.unbox(init_params(k)), out_shardings=param_sh)(init_key)
        opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
        state = TrainState(jax.device_put(jnp.zeros((), jnp.int32), repl), params, opt_state)
        dropout_key, host_state = jax.device_put(dropout_key, repl), {}
        if jax.process_index() == 0:
            metrics_lib.write_text_atomic(epath.Path(workdir) / RUN_CONFIG,
                                          config.to_json_best_effort(indent=2))

    train_step = jax.jit(
        make_train_step(model, tx, schedule, grad_accum_steps=accum, nsp=config.data.nsp,
                        activation_sharding=batch_sh),
        in_shardings=(state_sh, batch_sh, repl), out_shardings=(state_sh, repl),
        donate_argnums=(0,))
    eval_step = jax.jit(make_eval_step(model, batch_sh), in_shardings=(param_sh, batch_sh),
                        out_shardings=repl)

    total = config.train.num_steps
    step = int(jax.device_get(state.step))
    positions = host_state.get("data_positions")
    iterator = data.train(positions[jax.process_index()] if positions else None)
    flops = metrics_lib.pretraining_flops_per_sequence(cfg, seq_len, predictions) * batch_size
    peak = metrics_lib.peak_flops(list(mesh.devices.flat), config.train.peak_flops_per_device)
    logger = metrics_lib.TrainingLog(workdir, total, config.train.log_every, batch_size, flops,
                                     peak, config.quiet, host_state.get("window", []))
    logger.last_good_checkpoint = latest
    if latest is not None:
        logger.console.print(f"resumed from step {latest} ({ckpt.directory})")

    def save(at: int) -> None:
        ckpt.save(at, params=state.params, opt_state=state.opt_state,
                  progress={"step": state.step, "rng": dropout_key},
                  host={"data_positions": _gather_positions(iterator.position()),
                        "window": logger.window, "process_count": jax.process_count()})
        logger.last_good_checkpoint = at

    def evaluate(at: int) -> None:
        totals = None
        for local in data.eval():
            batch = sharding.make_global_batch(_features(local), batch_sh, batch_size)
            sums = jax.device_get(eval_step(state.params, batch))
            totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
        if totals is not None:
            logger.eval_record(at, {f"eval_{k}": float(v)
                                    for k, v in summarize(totals, config.data.nsp).items()})

    pending = None
    preempted = False
    try:
        while step < total:
            batch = sharding.make_global_batch(_features(next(iterator)), batch_sh, batch_size)
            state, step_metrics = train_step(state, batch, dropout_key)
            step += 1
            if pending is not None:
                logger.record(*pending, ckpt.directory)
            pending = (step, step_metrics)
            preempted = ckpt.preemption_requested(step)
            eval_due = (data.eval is not None and config.train.eval_every
                        and config.train.eval_batches and step % config.train.eval_every == 0)
            save_due = step % config.train.checkpoint_every == 0 or step == total or preempted
            if eval_due or save_due:
                # A checkpoint must never hold a diverged state: check this step first.
                logger.record(*pending, ckpt.directory)
                pending = None
                if save_due:
                    save(step)
                if eval_due:
                    evaluate(step)
                logger.restart_clock(step)
            if preempted:
                logger.console.print(f"SIGTERM: saved step {step} in {ckpt.directory}; run the "
                                     "same command again to resume")
                break
        if pending is not None:
            logger.record(*pending, ckpt.directory)
    finally:
        ckpt.close()
        logger.close()
    if not preempted and step == total:
        checkpoints.save_model(os.path.join(workdir, MODEL_DIR), state.params, cfg,
                               data.tokenizer, overwrite=True)
    return {"state": state, "step": step, "preempted": preempted}


def _features(local: dict) -> dict:
    missing = [f for f in FEATURES if f not in local]
    if missing:
        raise ValueError(f"input batch lacks features {missing}; expected {FEATURES}")
    return {f: local[f] for f in FEATURES}


def input_data(config: Any) -> PretrainingData:
    """The tf.data pipelines `config.data` describes, for this process's share of each batch."""
    from bertjax.data import pretraining, tokenizers

    data = config.data
    if not data.shard_dir:
        raise ValueError("config.data.shard_dir is empty: set it to the output of "
                         "`python -m bertjax.prepare` (--config.data.shard_dir=DIR)")
    tokenizer = tokenizers.load_tokenizer(data.shard_dir)
    vocab = pretraining.Vocab.from_tokenizer(tokenizer)
    recipe = dict(vocab=vocab, max_seq_length=data.max_seq_length,
                  max_predictions_per_seq=data.max_predictions_per_seq,
                  global_batch_size=config.train.global_batch_size, seed=config.seed,
                  mask_rate=data.mask_rate, mask_prob=data.mask_prob,
                  random_prob=data.random_prob, whole_word_masking=data.whole_word_masking,
                  nsp=data.nsp, short_seq_prob=data.short_seq_prob,
                  shuffle_tokens=data.shuffle_tokens,
                  process_index=jax.process_index(), process_count=jax.process_count())
    heldout = 0.0 if data.eval_shard_dir else data.heldout_fraction

    def train_iterator(start_position):
        return pretraining.pretraining_dataset(data.shard_dir, heldout_fraction=heldout,
                                               start_position=start_position, **recipe)

    eval_batches = None
    if config.train.eval_every and config.train.eval_batches and (data.eval_shard_dir
                                                                  or heldout > 0):
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


def run(config: Any, workdir: str) -> None:
    """`config.mode = 'pretrain'`: what `python -m bertjax.main` calls."""
    train(config, workdir, input_data(config))
