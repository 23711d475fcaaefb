"""The TPU plan: a run's exact train and eval steps compiled ahead of time for a TPU slice.

`python -m bertjax.main --config=... --compile_only=v5litepod-16` (or a topology name such
as `v5e:4x4`) builds the run's mesh, rules, model, optimizer and batch shapes over the
devices of that slice, as `libtpu` describes them without a TPU, and compiles the steps
with XLA:TPU on this machine (`jit(...).lower(abstract inputs).compile()`). Nothing runs and
nothing is written: pretraining needs no data at all; fine-tuning reads its model's
config.json and its training file (the labels and target shapes come from them).

What comes back is XLA's own account per chip: the bytes of the arguments, outputs and
temporaries, and the FLOPs. Parameters, optimizer state and batch per chip are counted from
their shardings. The step times printed beside the FLOPs are bounds at 100% and 50% of the
chip's dense bf16 peak, not measurements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import platform
import re
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from bertjax.training import metrics as metrics_lib
from bertjax.training import sharding

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Generation:
    """A TPU generation as Cloud TPU names it and libtpu describes it."""

    accelerator: str  # the accelerator type's prefix: v5litepod-16
    topology: str  # the topology name's prefix: v5e:4x4
    dims: int  # 2D torus (v5e, v6e) or 3D (v4, v5p)
    cores_per_name_unit: int  # v4-8 and v5p-8 count TensorCores (2 a chip); the others chips
    chip_config: str  # megacore: one JAX device per chip, its two TensorCores together
    hbm_gib: int  # per chip, from Google's Cloud TPU documentation
    single_host_chips: int  # the largest slice on one host


GENERATIONS = {
    "v4": Generation("v4", "v4", 3, 2, "megacore", 32, 4),
    "v5e": Generation("v5litepod", "v5e", 2, 1, "default", 16, 8),
    "v5p": Generation("v5p", "v5p", 3, 2, "megacore", 95, 4),
    "v6e": Generation("v6e", "v6e", 2, 1, "default", 32, 8),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str  # as given: v5litepod-16 or v5e:4x4
    generation: Generation
    shape: tuple[int, ...]  # chips along each torus axis

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def topology(self) -> str:
        return f"{self.generation.topology}:{'x'.join(map(str, self.shape))}"

    @property
    def chips_per_host(self) -> tuple[int, int, int]:
        if self.chips <= self.generation.single_host_chips:
            return (*self.shape, 1)[:3] if len(self.shape) == 2 else self.shape
        return (2, 2, 1)


def _standard_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The torus Cloud TPU builds for a power-of-two chip count: from 2x2(x1), each doubling
    goes to the smallest axis (the last of equals): v4-32 is 2x4x4, v5litepod-32 4x8."""
    if chips < 4:
        return (1,) * (dims - 1) + (chips,)
    shape = [2, 2] + [1] * (dims - 2)
    while math.prod(shape) < chips:
        smallest = min(shape)
        axis = max(i for i, n in enumerate(shape) if n == smallest)
        shape[axis] *= 2
    return tuple(shape)


def parse_slice(name: str) -> Slice:
    """A Cloud TPU accelerator type (v4-8, v5litepod-16, v5p-8, v6e-8) or a topology name
    (v5e:4x4, v4:2x2x2) as a Slice."""
    known = ", ".join(f"{g.accelerator}-N or {g.topology}:AxB" + ("xC" if g.dims == 3 else "")
                      for g in GENERATIONS.values())
    if ":" in name:
        prefix, _, dims = name.partition(":")
        generation = GENERATIONS.get(prefix)
        try:
            shape = tuple(int(n) for n in dims.split("x"))
        except ValueError:
            shape = ()
        if generation is None or len(shape) != generation.dims or min(shape, default=0) < 1:
            raise ValueError(f"--compile_only={name}: expected one of {known}")
        return Slice(name, generation, shape)
    prefix, _, count = name.rpartition("-")
    generation = next((g for g in GENERATIONS.values() if g.accelerator == prefix), None)
    if generation is None or not count.isdigit():
        raise ValueError(f"--compile_only={name}: expected one of {known}")
    chips, odd = divmod(int(count), generation.cores_per_name_unit)
    if odd or chips < 1 or chips & (chips - 1):
        raise ValueError(f"--compile_only={name}: not a slice size this plan knows the "
                         f"shape of; give its topology instead ({generation.topology}:"
                         f"{'x'.join(['A', 'B', 'C'][:generation.dims])})")
    return Slice(name, generation, _standard_shape(chips, generation.dims))


def check_libtpu() -> None:
    """One line when XLA:TPU is not installed here."""
    if importlib.util.find_spec("libtpu") is not None:
        return
    where = f"{sys.platform} {platform.machine()}"
    if not (sys.platform == "linux" and platform.machine() == "x86_64"):
        raise ImportError(f"--compile_only needs libtpu, which has Linux x86_64 wheels only "
                           f"(this is {where}); run the plan on a Linux x86_64 machine")
    raise ImportError(f"--compile_only needs libtpu: pip install 'jax[tpu]=={jax.__version__}' "
                       f"(or the test extra: pip install -e '.[test]')")


@contextlib.contextmanager
def _quiet_stderr():
    """libtpu prints warnings on this machine's missing TPU environment to the process's
    stderr as it loads; they say nothing about the plan."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def slice_devices(tpu: Slice) -> list:
    """The slice's devices as libtpu describes them (no TPU needed)."""
    check_libtpu()
    # No TPU is used: never ask a metadata server which one this is, and let several
    # processes (plans, test workers) load libtpu at once instead of taking its lock file.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    try:
        with _quiet_stderr():
            return list(topologies.get_topology_desc(
                platform="tpu", topology_name=tpu.topology,
                chip_config_name=tpu.generation.chip_config,
                chips_per_host_bounds=tpu.chips_per_host, num_slices=1,
                wrap=(False, False, False)).devices)
    except RuntimeError as e:  # XLA's errors: an unknown or malformed topology
        raise ValueError(f"--compile_only={tpu.name}: libtpu cannot describe topology "
                         f"{tpu.topology}: {str(e).splitlines()[0]}") from None


# --- compiling --------------------------------------------------------------------------


@dataclasses.dataclass
class StepPlan:
    """One compiled step's account, per chip."""

    name: str
    compile_seconds: float
    state_bytes: int  # parameters (+ optimizer state in the train step)
    batch_bytes: int
    temp_bytes: int
    total_bytes: int  # arguments + outputs - what donation aliases + temporaries
    flops: float
    compiled: bool = False  # False: XLA refused it, or its inputs alone exceed the memory

    def terms(self) -> dict[str, int]:
        state = "parameters + optimizer state" if "train" in self.name else "parameters"
        return {state: self.state_bytes, "batch": self.batch_bytes,
                "temporaries (activations and XLA's buffers)": self.temp_bytes}


def _bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of abstract arrays with shardings."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


@contextlib.contextmanager
def _no_compilation_cache():
    """TPU programs compiled without a TPU cannot be loaded from a compilation cache, and a
    run's cache should not fill with them. (JAX decides whether to use its cache once per
    process: this holds where nothing was compiled before, as in `--compile_only`.)"""
    saved = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", saved)


def compile_step(name: str, lower: Callable[[], Any], state: Any, batch: Any,
                 hbm_bytes: int) -> StepPlan:
    """The step's account; when its inputs alone exceed `hbm_bytes` it is not compiled (XLA
    would take minutes to say the same)."""
    state_bytes, batch_bytes = _bytes_per_device(state), _bytes_per_device(batch)
    if state_bytes + batch_bytes > hbm_bytes:
        return StepPlan(name, 0.0, state_bytes, batch_bytes, 0, state_bytes + batch_bytes, 0.0)
    started = time.perf_counter()
    try:
        with _quiet_stderr():
            compiled = lower().compile()
    except jax.errors.JaxRuntimeError as e:
        # XLA:TPU refuses a program whose temporaries exceed the chip: that is the answer.
        temp = _refused_temporaries(str(e))
        if temp is None:
            raise
        return StepPlan(name, time.perf_counter() - started, state_bytes, batch_bytes, temp,
                        state_bytes + batch_bytes + temp, 0.0)
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
             - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    return StepPlan(name, seconds, state_bytes, batch_bytes, memory.temp_size_in_bytes, total,
                    float(cost.get("flops", 0.0)), compiled=True)


_OUT_OF_MEMORY = re.compile(r"Ran out of memory (?:in memory space hbm|on HBM)"
                           r".*?HLO temporaries \(([\d.]+)([KMGT])\)", re.S)


def _refused_temporaries(message: str) -> int | None:
    """The temporaries' bytes from XLA:TPU's out-of-memory refusal, or None for another
    error."""
    match = _OUT_OF_MEMORY.search(message)
    if not match:
        return None
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2)))


@dataclasses.dataclass
class Program:
    """What a client gives the plan: its Steps and the abstract batches they take."""

    steps: Any  # trainer.Steps
    train_batch: dict[str, jax.ShapeDtypeStruct]
    eval_batch: dict[str, jax.ShapeDtypeStruct] | None  # None: the run never evaluates
    compute_dtype: Any
    note: str = ""  # what the plan assumed (a vocabulary size, labels)


def pretraining_program(config: Any, mesh: jax.sharding.Mesh, hosts: int) -> Program:
    from bertjax.models.bert import BertConfig
    from bertjax.training import pretrain, pretrain_config
    from bertjax.training.trainer import Steps

    pretrain_config.validate(config)
    vocab_size, note = _vocabulary_size(config)
    cfg = BertConfig.from_config(config.model, vocab_size=vocab_size, platform="tpu")
    steps = Steps(**pretrain.steps_args(config, cfg, mesh), process_count=hosts)
    batch = pretrain.batch_spec(config)
    return Program(steps, batch, batch if pretrain.evaluates(config) else None, cfg.dtype,
                   "; ".join(n for n in (note, _attention_note(cfg)) if n))


def _attention_note(cfg) -> str:
    # XLA's cost analysis cannot see into a Pallas kernel (benchmarks/tpu_attention.py
    # counts the kernel's own matmuls).
    if cfg.attention == "splash":
        return "splash attention: the FLOPs leave out the kernel's (about 1-4% of BERT-base's)"
    return ""


# The original English BERT's WordPiece vocabulary, when nothing says which one a run uses.
_DEFAULT_VOCAB_SIZE = 30522


def _vocabulary_size(config: Any) -> tuple[int, str]:
    if config.model.vocab_size is not None:
        return config.model.vocab_size, ""
    if config.data.shard_dir:
        from bertjax.data import tokenizers
        size = tokenizers.load_tokenizer(config.data.shard_dir).vocab_size
        return size, f"vocabulary {size:,} (data.shard_dir's tokenizer)"
    return _DEFAULT_VOCAB_SIZE, (f"vocabulary {_DEFAULT_VOCAB_SIZE:,} (BERT's English "
                                 f"WordPiece: set model.vocab_size or data.shard_dir for yours)")


def finetuning_program(config: Any, mesh: jax.sharding.Mesh, hosts: int) -> Program:
    from bertjax.data.tokenizers import load_tokenizer
    from bertjax.models.bert import BertConfig
    from bertjax.tasks import base as tasks
    from bertjax.training import checkpoints, finetune, finetune_config
    from bertjax.training.trainer import Steps

    task = finetune_config.validate(config)
    source = checkpoints.open_model(config.init_checkpoint, config.task.tokenizer)
    cfg = BertConfig.from_config(config.model, source.config, platform="tpu")
    examples = task.read_training()
    labels = task.label_vocab(examples)
    # A few examples give every array's row shape; the plan's batches are abstract.
    features = task.featurize(examples[:64], load_tokenizer(source.tokenizer_dir), labels,
                              training=True)
    arrays, keys = finetune.training_arrays(config, task, features)
    model = task.model(cfg, labels)
    steps = Steps(**finetune.steps_args(config, task, model, 1, mesh), process_count=hosts)
    sharding.check_batch_size(config.train.eval_batch_size, mesh, steps.rules,
                              process_count=hosts)

    def spec(names: Sequence[str], rows: int) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: jax.ShapeDtypeStruct((rows, *arrays[k].shape[1:]), arrays[k].dtype)
                for k in names}
    return Program(steps, spec(keys, config.train.global_batch_size),
                   spec(tasks.INPUTS, config.train.eval_batch_size), cfg.dtype,
                   _attention_note(cfg))


PROGRAMS = {"pretrain": pretraining_program, "finetune": finetuning_program}


@dataclasses.dataclass
class Plan:
    tpu: Slice
    devices: list
    mesh_shape: dict[str, int]
    global_batch_size: int
    compute_dtype: Any
    steps: list[StepPlan]
    note: str

    @property
    def hosts(self) -> int:
        return len({d.process_index for d in self.devices})

    @property
    def device_kind(self) -> str:
        return self.devices[0].device_kind

    @property
    def hbm_bytes(self) -> int:
        return self.tpu.generation.hbm_gib * GIB

    @property
    def peak_flops(self) -> float:
        return metrics_lib.table_peak_flops(self.device_kind)

    @property
    def largest(self) -> StepPlan:
        return max(self.steps, key=lambda s: s.total_bytes)

    @property
    def fits(self) -> bool:
        return all(s.compiled for s in self.steps) and self.largest.total_bytes <= self.hbm_bytes


def compile_plan(config: Any, slice_name: str, global_batch_size: int | None = None,
                 devices: Sequence | None = None, evaluation: bool = True) -> Plan:
    """The run of `config` compiled for the slice `slice_name` (its config's global batch, or
    `global_batch_size`); the eval step too, when the run evaluates and `evaluation` is on.
    `devices`: the slice's, when the caller has them already."""
    tpu = parse_slice(slice_name)
    devices = list(devices) if devices is not None else slice_devices(tpu)
    if global_batch_size is not None:
        config = config.copy_and_resolve_references()
        config.train.global_batch_size = global_batch_size
    if config.mode not in PROGRAMS:
        raise ValueError(f"config.mode {config.mode!r}: expected one of {', '.join(PROGRAMS)}")
    mesh = sharding.make_mesh(config.mesh.shape, devices)
    hosts = len({d.process_index for d in devices})
    program = PROGRAMS[config.mode](config, mesh, hosts)
    steps = program.steps
    hbm = tpu.generation.hbm_gib * GIB
    with _no_compilation_cache():
        plans = [compile_step("train step", lambda: steps.lower_train_step(program.train_batch),
                              steps.abstract_state(), steps.abstract_batch(program.train_batch),
                              hbm)]
        # A train step that cannot fit decides the plan: no need to wait for the eval step.
        if program.eval_batch is not None and evaluation and plans[0].compiled:
            plans.append(compile_step(
                "eval step", lambda: steps.lower_eval_step(program.eval_batch),
                steps.abstract_params, steps.abstract_batch(program.eval_batch), hbm))
    return Plan(tpu, devices, dict(mesh.shape), config.train.global_batch_size,
                program.compute_dtype, plans, program.note)


# --- the report -------------------------------------------------------------------------


def size(n: float) -> str:
    """Bytes in the largest unit (KiB, MiB, GiB) that keeps a digit before the point."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def table(plan: Plan) -> str:
    """The plan as the console shows it."""
    mesh = " x ".join(f"{n} {axis}" for axis, n in plan.mesh_shape.items())
    g = plan.tpu.generation
    lines = [
        f"TPU plan for {plan.tpu.name} ({plan.tpu.topology}): {plan.tpu.chips} chips "
        f"({plan.device_kind}, {g.hbm_gib} GiB HBM each), {plan.hosts} "
        f"host{'s' if plan.hosts > 1 else ''}, mesh {mesh}",
        f"global batch {plan.global_batch_size}, "
        f"{np.dtype(plan.compute_dtype).name} compute, float32 parameters"
        + (f"; {plan.note}" if plan.note else ""),
        "per chip:",
        f"{'step':<11} {'compile s':>9} {'params+opt':>11} {'batch':>10} {'temporaries':>11} "
        f"{'total':>10} {'of HBM':>6} {'GFLOP':>9} {'time at 100% / 50% of peak':>27}",
    ]
    for s in plan.steps:
        if not s.compiled:
            if s.temp_bytes:
                lines.append(f"{s.name:<11} {s.compile_seconds:>9.1f} {size(s.state_bytes):>11} "
                             f"{size(s.batch_bytes):>10} {size(s.temp_bytes):>11} "
                             f"{size(s.total_bytes):>10} {s.total_bytes / plan.hbm_bytes:>6.0%}"
                             f"   refused by XLA:TPU: out of memory")
            else:
                lines.append(f"{s.name:<11} {'-':>9} {size(s.state_bytes):>11} "
                             f"{size(s.batch_bytes):>10}   not compiled: these alone exceed "
                             f"the chip's memory")
            continue
        if plan.peak_flops:
            bound = (f"{s.flops / plan.peak_flops * 1e3:.2f} / "
                     f"{2 * s.flops / plan.peak_flops * 1e3:.2f} ms")
        else:
            bound = "no peak known"
        lines.append(f"{s.name:<11} {s.compile_seconds:>9.1f} {size(s.state_bytes):>11} "
                     f"{size(s.batch_bytes):>10} {size(s.temp_bytes):>11} "
                     f"{size(s.total_bytes):>10} {s.total_bytes / plan.hbm_bytes:>6.0%} "
                     f"{s.flops / 1e9:>9,.1f} {bound:>27}")
    lines.append("step times are lower bounds from FLOPs and the chip's dense bf16 peak "
                 f"({plan.peak_flops / 1e12:,.0f} TFLOP/s), not measurements")
    lines.append(("fits" if plan.fits else "does NOT fit") + f": the largest step needs "
                 f"{size(plan.largest.total_bytes)} of {g.hbm_gib} GiB per chip")
    return "\n".join(lines)


def refusal(plan: Plan, accumulation: int) -> str:
    """One line: why the run does not fit, its largest term, and what to try for that term."""
    step = plan.largest
    term, bytes_ = max(step.terms().items(), key=lambda kv: kv[1])
    if term == "batch":
        hint = "a smaller train.global_batch_size, or a larger slice"
    elif term.startswith("parameters"):
        hint = ("parameters and optimizer state sharded over the chips "
                "(--config.mesh.shape='(1,-1,1)'), or a larger slice")
    else:
        hint = "--config.model.remat=True, or a larger slice"
        free = plan.hbm_bytes - step.state_bytes - step.batch_bytes
        if free > 0:
            # Temporaries grow with the micro-batch: the smallest power of two that brings
            # them under what is left, an estimate to check with another --compile_only.
            split = 2 ** math.ceil(math.log2(max(step.temp_bytes / free, 1.0)))
            if split > 1 and plan.global_batch_size % (accumulation * split) == 0:
                hint = (f"--config.optimizer.grad_accum_steps={accumulation * split} (an "
                        f"estimate: check it with --compile_only), " + hint)
    return (f"the {step.name} needs {size(step.total_bytes)} per chip on {plan.tpu.name} "
            f"({plan.device_kind}, {plan.tpu.generation.hbm_gib} GiB): the largest term is "
            f"{term}, {size(bytes_)}; try {hint}")


def largest_batch(config: Any, slice_name: str, first: Plan, granule: int,
                  max_compiles: int = 5, precision: float = 0.02,
                  report: Callable[[str], None] = print,
                  compile_at: Callable[[int], Plan] | None = None) -> tuple[Plan, int | None]:
    """The largest global batch (a multiple of `granule`) whose steps fit, found by
    compiling, and the smallest batch found not to fit (None if none was tried).

    Only train steps are compiled here: evaluation holds neither gradients nor optimizer
    state (at the config's batch `first` shows both).

    Memory grows close to linearly with the batch (a little slower: XLA reuses buffers), so
    the two plans nearest the limit predict it; each further compile narrows the gap between
    the largest fit and the smallest misfit, until it is within `precision` of the batch (or
    one granule), or `max_compiles` compiles were spent."""
    def plan_at(batch: int) -> Plan:
        plan = (compile_at or (lambda b: compile_plan(config, slice_name, b, first.devices,
                                                       evaluation=False)))(batch)
        report(f"  global batch {batch}: {size(plan.largest.total_bytes)} per chip, "
               f"{'fits' if plan.fits else 'does not fit'}")
        return plan

    def rounded(batch: float) -> int:
        return max(granule, int(batch) // granule * granule)

    plans = {first.global_batch_size: first}
    other = rounded(first.global_batch_size * 2 if first.fits else first.global_batch_size / 2)
    if other not in plans:
        plans[other] = plan_at(other)
    for _ in range(max_compiles):
        low = max((b for b, p in plans.items() if p.fits), default=0)
        high = min((b for b, p in plans.items() if not p.fits), default=None)
        margin = max(granule, precision * low)
        if high is not None and high - low <= margin:
            break
        # Interpolate between the two measured batches nearest the limit (extrapolate when
        # the limit is not bracketed yet); a plan refused before compiling has no
        # temporaries to go by.
        measured = [b for b, p in plans.items() if p.largest.temp_bytes > 0]
        nearest = sorted(measured, key=lambda b: abs(b - (low if high is None else high)))[:2]
        if high is not None and low in measured and high in measured:
            nearest = [low, high]
        b0, b1 = sorted(nearest) if len(nearest) == 2 else (0, 0)
        m0, m1 = (plans[b].largest.total_bytes for b in (b0, b1)) if b1 else (0, 0)
        if m1 > m0:
            guess = b0 + (first.hbm_bytes - m0) * (b1 - b0) / (m1 - m0)
        else:  # no slope to go by: bisect, or double past the largest fit
            guess = (low + high) / 2 if high is not None else 2 * low
        # Memory bends down as the batch grows (XLA reuses buffers), so a line through two
        # points lands on the near side of the limit: step over it by the precision wanted.
        if guess <= low + margin:
            guess = low + 2 * margin
        elif high is not None and guess >= high - margin:
            guess = high - 2 * margin
        guess = rounded(guess)
        if high is not None and not low < guess < high:
            guess = rounded((low + high) / 2)
        if guess in plans or (high is not None and not low < guess < high):
            break
        plans[guess] = plan_at(guess)
    fitting = [b for b, p in plans.items() if p.fits]
    if not fitting:
        raise ValueError(f"no global batch down to {min(plans)} fits {slice_name}")
    failing = [b for b, p in plans.items() if not p.fits]
    return plans[max(fitting)], min(failing, default=None)
