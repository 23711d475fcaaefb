"""The training loop. Pretraining and fine-tuning are its clients; nothing here knows which.

A client gives the trainer its model and an `Objective` (how a batch becomes a loss and
logged metrics, and what evaluation brings back), the optimizer, and hooks for what
differs: how parameters start, where batches come from, when and how to evaluate, and what
host state a checkpoint keeps. The trainer owns the rest, once: the mesh and shardings,
abstract initialisation, restore-or-start, the jitted steps (`train_step(state, batch, rng)
-> (state, metrics)`, state donated, dropout key `fold_in(rng, step)`, metrics fetched to the
host one step late), the checkpoint cadence, preemption (SIGTERM) and the divergence stop.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import batching, files
from bertjax.models import dropout
from bertjax.training import checkpoints, integrity, metrics as metrics_lib, optimizers
from bertjax.training import sharding


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a client trains, as pure functions of arrays (the trainer jits them).

    apply(params, batch, rng) -> model outputs; rng None: deterministic (evaluation).
    normalizers(batch) -> the whole batch's totals the loss divides by, computed once per
        step, so the micro-batches' gradients add up to the full batch's.
    loss(outputs, micro_batch, normalizers) -> (loss, sums): the micro-batch's share.
    metrics(loss, sums) -> the step's logged metrics (loss and sums summed over micro-batches).
    evaluate(outputs, batch) -> what an evaluation step brings back to the host.
    """

    apply: Callable
    normalizers: Callable
    loss: Callable
    metrics: Callable
    evaluate: Callable


# model.dropout_rng -> (its JAX generator, 32-bit words of its key); threefry is the step key.
_DROPOUT_GENERATORS = {"rbg": ("rbg", 4), "unsafe_rbg": ("unsafe_rbg", 4),
                       "counter_hash": (dropout.COUNTER_HASH, 2)}
DROPOUT_RNGS = ("threefry", *_DROPOUT_GENERATORS)


def dropout_key(key: jax.Array, impl: str) -> jax.Array:
    """The dropout key of a (micro-)step, drawn from its threefry `key` (what checkpoints
    hold, whatever `impl`): itself, or a key of another generator seeded from it: JAX's `rbg`
    / `unsafe_rbg`, whose bits come from XLA's RngBitGenerator (cheap on TPUs and GPUs), or
    `dropout.COUNTER_HASH` (cheap on CPUs). A function of (seed, step, micro-batch) either
    way, so a resumed run draws the same masks."""
    if impl == "threefry":
        return key
    generator, words = _DROPOUT_GENERATORS[impl]
    return jax.random.wrap_key_data(jax.random.bits(key, (words,), jnp.uint32), impl=generator)


def make_train_step(objective: Objective, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, grad_accum_steps: int,
                    dropout_rng: str = "threefry"):
    def train_step(state: TrainState, batch: dict, rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        normalizers = objective.normalizers(batch)

        def loss_fn(params, micro_batch, index):
            outputs = objective.apply(params, micro_batch,
                                      dropout_key(jax.random.fold_in(step_rng, index),
                                                  dropout_rng))
            return objective.loss(outputs, micro_batch, normalizers)

        (loss, sums), grads = optimizers.accumulate_gradients(loss_fn, state.params, batch,
                                                              grad_accum_steps)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step_metrics = {**objective.metrics(loss, sums), "grad_norm": optax.tree.norm(grads),
                        "learning_rate": schedule(state.step)}
        if batching.EXAMPLE_WEIGHTS in batch:  # packed rows: the progress line counts examples
            step_metrics["examples"] = jnp.sum(batch[batching.EXAMPLE_WEIGHTS])
        return TrainState(state.step + 1, params, opt_state), step_metrics

    return train_step


def make_eval_step(objective: Objective):
    def eval_step(params, batch: dict):
        return objective.evaluate(objective.apply(params, batch, None), batch)
    return eval_step


def with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


class Steps:
    """A run's shardings, abstract state and jitted steps, with nothing materialised: what
    the `Trainer` runs, and what `plan.py` compiles ahead of time for a TPU slice.

    `mesh` comes from `sharding.make_mesh` (the client builds it first: a model that places
    sharding constraints is given it). `init(rng)` initialises the model's (logically
    partitioned) parameters. `process_count` is the number of hosts that feed the batch
    (this run's, unless a plan compiles for another slice).
    """

    def __init__(self, *, init: Callable, objective: Objective,
                 tx: optax.GradientTransformation, schedule: optax.Schedule,
                 mesh: jax.sharding.Mesh, rules: sharding.Rules, global_batch_size: int,
                 grad_accum_steps: int, seed: int, dropout_rng: str = "threefry",
                 process_count: int | None = None):
        self.tx, self.mesh = tx, mesh
        self.rules = sharding.check_rules(rules)
        sharding.check_batch_size(global_batch_size, self.mesh, self.rules, grad_accum_steps,
                                  process_count)
        self.global_batch_size = global_batch_size

        root = jax.random.PRNGKey(seed)
        self._init, self._init_key = init, jax.random.fold_in(root, 0)
        self._dropout_key = jax.random.fold_in(root, 1)
        boxed = jax.eval_shape(init, self._init_key)
        self.param_shardings = sharding.param_shardings(boxed, self.mesh, self.rules)
        self.abstract_params = with_shardings(nn.unbox(boxed), self.param_shardings)
        abstract_opt = jax.eval_shape(tx.init, self.abstract_params)
        self.opt_shardings = sharding.optimizer_shardings(tx, abstract_opt, self.param_shardings,
                                                          self.mesh)
        self.abstract_opt_state = with_shardings(abstract_opt, self.opt_shardings)
        self.replicated = sharding.replicated(self.mesh)
        self.batch_sharding = sharding.batch_sharding(self.mesh, self.rules)
        state_sh = TrainState(self.replicated, self.param_shardings, self.opt_shardings)
        self.jitted_train_step = jax.jit(
            make_train_step(objective, tx, schedule, grad_accum_steps, dropout_rng),
            in_shardings=(state_sh, self.batch_sharding, self.replicated),
            out_shardings=(state_sh, self.replicated), donate_argnums=(0,))
        self.jitted_eval_step = jax.jit(
            make_eval_step(objective), in_shardings=(self.param_shardings, self.batch_sharding),
            out_shardings=self.replicated)
        self.train_step = self._in_mesh(self.jitted_train_step)
        self.eval_step = self._in_mesh(self.jitted_eval_step)

    def _in_mesh(self, fn: Callable) -> Callable:
        """`fn` traced with the logical axis rules in context, for the model's logical
        sharding constraints."""
        def call(*args):
            with nn.logical_axis_rules(self.rules):
                return fn(*args)
        return call

    def abstract_state(self) -> TrainState:
        return TrainState(jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated),
                          self.abstract_params, self.abstract_opt_state)

    def abstract_rng(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=self.replicated)

    def abstract_batch(self, spec: dict[str, jax.ShapeDtypeStruct]) -> dict:
        """A global batch's abstract arrays (shapes and dtypes from `spec`), sharded as the
        steps take them."""
        return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sharding)
                for k, v in spec.items()}

    def lower_train_step(self, batch_spec: dict[str, jax.ShapeDtypeStruct]):
        """The train step lowered for abstract inputs (nothing runs; `.compile()` next)."""
        with nn.logical_axis_rules(self.rules):
            return self.jitted_train_step.lower(self.abstract_state(),
                                                self.abstract_batch(batch_spec),
                                                self.abstract_rng())

    def lower_eval_step(self, batch_spec: dict[str, jax.ShapeDtypeStruct]):
        with nn.logical_axis_rules(self.rules):
            return self.jitted_eval_step.lower(self.abstract_params,
                                               self.abstract_batch(batch_spec))


class Trainer(Steps):
    """The steps of one run in `workdir`, its state and its loop (see `Steps` for the rest of
    the arguments)."""

    def __init__(self, *, workdir: str, keep_checkpoints: int, **steps):
        super().__init__(**steps)
        self.workdir = workdir
        self.checkpoints = checkpoints.RunCheckpoints(workdir, keep_checkpoints)
        self.state: TrainState | None = None
        self.rng: jax.Array | None = None
        self.resumed_from: int | None = None

    # --- the state ---------------------------------------------------------------------------

    def fresh_params(self, exclude: Sequence[str] = ()) -> dict:
        """Randomly initialised parameters, sharded; top-level `exclude`d parts (to be loaded
        from a checkpoint instead) are never materialised."""
        shardings = {k: v for k, v in self.param_shardings.items() if k not in exclude}

        def init(key):
            return {k: v for k, v in nn.unbox(self._init(key)).items() if k not in exclude}
        return jax.jit(init, out_shardings=shardings)(self._init_key)

    def start(self, initial_params: Callable[[], dict], fallback: bool = True) -> dict | None:
        """Restores the newest checkpoint of the workdir that verifies (returns its host
        state), or starts from `initial_params()` (returns None). A checkpoint that fails
        verification is reported and removed, and the next older one tried, unless
        `fallback` is off (then it is an error)."""
        steps = self.checkpoints.all_steps()
        while steps:
            step = steps.pop()
            try:
                restored = self.checkpoints.restore(
                    step, abstract_params=self.abstract_params,
                    abstract_opt_state=self.abstract_opt_state,
                    abstract_progress={"step": self.abstract_state().step,
                                       "rng": self.abstract_rng()})
            except checkpoints.CorruptCheckpoint as e:
                if not fallback:
                    raise checkpoints.CorruptCheckpoint(
                        f"{e} (train.restore_fallback is off: move it away to resume from an "
                        f"older checkpoint)") from None
                metrics_lib.warn(f"{e}; removed it, " + (f"resuming from step {steps[-1]}"
                                                         if steps else "starting afresh"))
                self.checkpoints.delete(step)
                continue
            metrics_lib.truncate_logs(self.workdir, step)
            self.state = TrainState(restored["progress"]["step"], restored["params"],
                                    restored["opt_state"])
            self.rng = restored["progress"]["rng"]
            self.resumed_from = step
            return restored["host"]
        metrics_lib.truncate_logs(self.workdir, 0)
        params = initial_params()
        opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)
        self.state = TrainState(jax.device_put(jnp.zeros((), jnp.int32), self.replicated),
                                params, opt_state)
        self.rng = jax.device_put(self._dropout_key, self.replicated)
        return None

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state.step))

    def global_batch(self, local: dict[str, np.ndarray], size: int | None = None) -> dict:
        """Global arrays of a batch from this process's rows of it."""
        return sharding.make_global_batch(local, self.batch_sharding,
                                          size or self.global_batch_size)

    def place_rows(self, batch: dict[str, np.ndarray]) -> dict:
        """Global arrays of a batch every process holds whole (it keeps its own rows)."""
        return self.global_batch({k: sharding.local_rows(v) for k, v in batch.items()},
                                 len(next(iter(batch.values()))))

    def save(self, step: int, host: dict, log: metrics_lib.TrainingLog) -> None:
        """Starts an asynchronous save of the state after `step`, with its fingerprints;
        a state holding non-finite values is never saved."""
        prints = {"params": integrity.fingerprints(self.state.params),
                  "opt_state": integrity.fingerprints(self.state.opt_state)}
        bad = integrity.non_finite(prints["params"]) + integrity.non_finite(prints["opt_state"])
        if bad:
            raise log.diverged(f"the state after step {step} holds non-finite values in "
                               f"{len(bad)} arrays (first: {bad[0]})",
                               self.checkpoints.directory)
        self.checkpoints.save(step, params=self.state.params, opt_state=self.state.opt_state,
                              progress={"step": self.state.step, "rng": self.rng},
                              host={**host, "fingerprints": prints})

    # --- the loop ----------------------------------------------------------------------------

    def describe(self, compute_dtype, peak_flops: float) -> str:
        """The run's start-up line: processes, devices, mesh, model size, batch, and the peak
        the progress line's MFU is counted against."""
        devices = list(self.mesh.devices.flat)
        mesh = " x ".join(f"{n} {a}" for a, n in self.mesh.shape.items())
        params = sum(x.size for x in jax.tree.leaves(self.abstract_params))
        return (f"process {jax.process_index()} of {jax.process_count()} | {len(devices)} "
                f"{devices[0].platform} devices ({devices[0].device_kind}) | mesh {mesh} | "
                f"{params:,} parameters, {jnp.dtype(compute_dtype).name} compute | global batch "
                f"{self.global_batch_size} | MFU against a peak of {peak_flops / 1e9:,.0f} "
                f"GFLOP/s")

    def fit(self, total: int, batches: Iterator[dict], log: metrics_lib.TrainingLog, *,
            eval_due: Callable[[int], bool], save_due: Callable[[int], bool],
            evaluate: Callable[[int], None], host_state: Callable[[], dict],
            profile_steps: tuple[int, int] | None = None) -> tuple[int, bool]:
        """Trains to step `total` on `batches` (this process's rows), evaluating and saving
        after the steps `eval_due` and `save_due` name, and saving at the end and on SIGTERM;
        returns (step reached, preempted). `host_state()` is what a checkpoint keeps of the
        client (JSON). Steps [profile_steps[0], profile_steps[1]) are traced with the JAX
        profiler into WORKDIR/profile (None: no trace).

        A checkpoint never holds a diverged state: the step's metrics are checked before
        every save. On SIGTERM the step is saved and the loop stops.
        """
        step, pending, preempted = self.step, None, False
        log.last_good_checkpoint = self.resumed_from
        if self.resumed_from is not None:
            log.console.print(f"resumed from step {self.resumed_from} "
                              f"({self.checkpoints.directory})")
        first, tracing = step, False
        profile_steps = profile_steps or (-1, -1)
        started = time.perf_counter()
        try:
            while step < total:
                if step == profile_steps[0] < profile_steps[1]:
                    jax.profiler.start_trace(str(files.path(self.workdir) / "profile"))
                    tracing = True
                self.state, step_metrics = self.train_step(
                    self.state, self.global_batch(next(batches)), self.rng)
                step += 1
                if step == first + 1:
                    jax.block_until_ready(step_metrics)
                    log.console.print(f"first step (compiling included) in "
                                      f"{time.perf_counter() - started:.1f} s")
                if tracing and step >= profile_steps[1]:
                    jax.profiler.stop_trace()
                    tracing = False
                    log.console.print(f"profile of steps {profile_steps[0]}-"
                                      f"{profile_steps[1] - 1} in {self.workdir}/profile")
                if pending is not None:
                    log.record(*pending, self.checkpoints.directory)
                pending = (step, step_metrics)
                self.checkpoints.raise_save_errors()
                preempted = self.checkpoints.preemption_requested(step)
                evaluating = eval_due(step)
                saving = save_due(step) or step == total or preempted
                if evaluating or saving:
                    log.record(*pending, self.checkpoints.directory)
                    pending = None
                    if saving:
                        self.save(step, host_state(), log)
                        log.last_good_checkpoint = step
                    if evaluating:
                        evaluate(step)
                    log.restart_clock(step)
                if preempted:
                    log.console.print(f"stopped by a signal: saved step {step} in "
                                      f"{self.checkpoints.directory}; run the same command "
                                      "again to resume")
                    break
            if pending is not None:
                log.record(*pending, self.checkpoints.directory)
        finally:
            if tracing:
                jax.profiler.stop_trace()
            self.checkpoints.close()
        return step, preempted


def batched_outputs(step_fn: Callable, params, arrays: dict[str, np.ndarray],
                    keys: Sequence[str], batch_size: int, place: Callable = dict,
                    bucket_lengths: Sequence[int] = ()) -> Any:
    """`step_fn(params, batch)` for every row of `arrays`, in batches of `batch_size` (the
    last one padded with a repeated row, its outputs cut off again), fetched to the host.
    `place(batch)` turns a batch of numpy rows into the step's input.

    With `bucket_lengths`, rows are batched shortest first and each batch is cut to the
    shortest bucket that holds it (batching.bucket_length), as training batches are; outputs
    that run along the positions are padded back to the full length with zeros
    (batching.untrim), and every output comes back in the rows' own order.
    """
    n, full = len(arrays[keys[0]]), batching.row_length(arrays)
    if bucket_lengths:
        order = np.argsort(batching.real_lengths(arrays), kind="stable")
        rows = np.concatenate([order, np.full(-n % batch_size, order[-1])])
    else:
        order = None
        rows = np.concatenate([np.arange(n), np.zeros(-n % batch_size, np.int64)])
    full_shapes = None
    outputs = []
    for start in range(0, len(rows), batch_size):
        batch = {k: arrays[k][rows[start:start + batch_size]] for k in keys}
        length = batching.bucket_length(batch, bucket_lengths) if bucket_lengths else full
        if length == full:
            outputs.append(jax.device_get(step_fn(params, place(batch))))
            continue
        if full_shapes is None:  # which outputs have a positions axis: those that change
            full_shapes = jax.eval_shape(step_fn, params, place(batch))
        out = jax.device_get(step_fn(params, place(batching.trim(batch, length))))
        outputs.append(jax.tree.map(lambda x, s: batching.untrim(x, s.shape, full - length),
                                    out, full_shapes))
    outputs = jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *outputs)
    if order is None:
        return outputs
    return jax.tree.map(lambda x: x[np.argsort(order)], outputs)
