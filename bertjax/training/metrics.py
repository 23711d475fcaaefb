"""Where training metrics go: metrics.jsonl, TensorBoard events and a console progress line.

TensorBoard events are written by `events.py` with the `tensorboard` package alone (no
TensorFlow). Only process 0 writes.

Model-FLOPs utilisation (MFU) compares the model's matmul FLOPs per second with the devices'
peak: a table of dense bf16 peaks for known accelerators, or, on CPU and unknown devices, a
measured large f32 matmul.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import files
from bertjax.models.bert import BertConfig
from bertjax.training import events

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"

# Dense (not sparse) bf16 peak FLOP/s per chip from the vendors' data sheets, with every
# device_kind the chip reports (JAX's TPU names, the CUDA device name). Kinds match whole
# (case and spacing aside), never by prefix: "NVIDIA L4" must not price an L40, nor "NVIDIA
# A10" an A10G. Chips not listed (0: a measured matmul instead): set
# train.peak_flops_per_device.
_CHIPS = (
    (2307e12, ("TPU7x",)),  # Ironwood
    (918e12, ("TPU v6 lite", "TPU v6e")),  # Trillium
    (459e12, ("TPU v5", "TPU v5p")),
    (197e12, ("TPU v5 lite", "TPU v5e")),
    (275e12, ("TPU v4",)),
    (123e12, ("TPU v3",)),
    (45e12, ("TPU v2",)),
    (2500e12, ("NVIDIA GB200",)),
    (2250e12, ("NVIDIA B200",)),
    (989e12, ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H800")),  # SXM
    (835e12, ("NVIDIA H100 NVL", "NVIDIA H200 NVL")),
    (756e12, ("NVIDIA H100 PCIe",)),
    (312e12, ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
              "NVIDIA A100 80GB PCIe", "NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe")),
    (362e12, ("NVIDIA L40S",)),
    (181e12, ("NVIDIA L40",)),
    (121e12, ("NVIDIA L4",)),
    (125e12, ("NVIDIA A10",)),
    # float16: V100 has no bfloat16.
    (125e12, ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB")),
    (112e12, ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB")),
)


def _normal_kind(device_kind: str) -> str:
    return " ".join(device_kind.lower().split())


PEAK_FLOPS = {_normal_kind(kind): flops for flops, kinds in _CHIPS for kind in kinds}


def encoder_flops_per_sequence(config: BertConfig, seq_len: int,
                               read_positions: int | None = None) -> float:
    """Matmul FLOPs to train the encoder on one sequence (forward + backward = 3x forward):
    its projections and attention scores (what a fine-tuning step is, bar its small head).
    `read_positions`: how many positions the heads read ([CLS]s included), which is all the
    last layer computes with `sparse_last_layer` (its keys and values still at every one)."""
    d, f = config.hidden_size, config.intermediate_size

    def layer(queries: int) -> float:
        keys_values = 2 * seq_len * 2 * d * d
        return keys_values + 2 * queries * (2 * d * d + 2 * d * f + 2 * seq_len * d)

    last = read_positions if config.sparse_last_layer and read_positions is not None else seq_len
    return 3.0 * ((config.num_hidden_layers - 1) * layer(seq_len) + layer(last))


def pretraining_flops_per_sequence(config: BertConfig, seq_len: int, predictions: int) -> float:
    """Matmul FLOPs to train on one sequence: the encoder, the pooler and NSP head, and the
    MLM head at the `predictions` gathered positions only (which is all the model computes).
    """
    d, v = config.hidden_size, config.vocab_size
    mlm = predictions * 2 * (d * d + d * v)
    pooler_nsp = 2 * (d * d + 2 * d)
    return (encoder_flops_per_sequence(config, seq_len, predictions + 1)
            + 3.0 * (mlm + pooler_nsp))


def measure_matmul_flops(size: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
    """Best-of FLOP/s of a [size, size] matmul of `dtype` inputs on the default device,
    accumulated and returned in float32: how matrix units (GPU tensor cores, TPU MXUs, CPU
    AMX) run bf16 at their peak. XLA:CPU upcasts a bf16 dot with a bf16 result to float32
    first, which would understate a bf16 peak 2-4x (benchmarks/matmul_dtypes.py)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
    matmul = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    matmul(x).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def peak_flops(devices, per_device: float | None = None) -> float:
    """Peak FLOP/s of the run's devices: `per_device` if given, else the table, else (CPU,
    unknown devices) a measured matmul, counted once per host since host devices share the
    same cores."""
    if per_device is not None:
        return per_device * len(devices)
    table = table_peak_flops(devices[0].device_kind)
    if table:
        return table * len(devices)
    return measure_matmul_flops() * jax.process_count()


def table_peak_flops(device_kind: str) -> float:
    """One device's dense peak FLOP/s from PEAK_FLOPS, or 0 for a kind it does not list."""
    return PEAK_FLOPS.get(_normal_kind(device_kind), 0.0)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_line(step: int, total: int, m: dict, eta_s: float) -> str:
    parts = [f"step {step}/{total}", f"loss {m['loss']:.4f}"]
    parts += [f"{label} {m[key]:.3f}" for key, label in (("mlm_accuracy", "mlm_acc"),
                                                         ("nsp_accuracy", "nsp_acc")) if key in m]
    parts.append(f"lr {m['learning_rate']:.2e}")
    if "seq_per_sec" in m:
        parts += [f"{m['seq_per_sec']:.1f} seq/s", f"MFU {100 * m['mfu']:.1f}%"]
    parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


def warn(message: str) -> None:
    """A line on stderr from process 0, quiet or not: something the user must know."""
    if jax.process_index() == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def truncate_logs(workdir: str, last_step: int) -> None:
    """Drops the records and TensorBoard events after `last_step` (the step the run restarts
    from; 0 for a fresh start), so the logs of a run that was killed read like those of an
    uninterrupted one. Atomic rewrites; a partial last line or record is dropped too."""
    if jax.process_index() != 0:
        return
    path = files.path(workdir) / METRICS_FILE
    if path.exists():
        kept, dropped = [], 0
        for line in files.read_text(path).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if record["step"] <= last_step:
                kept.append(line)
        if dropped:
            warn(f"{path}: dropped {dropped} unreadable line(s) (a run killed while writing)")
        files.write_text(path, "".join(line + "\n" for line in kept))
    events.truncate(os.path.join(workdir, TENSORBOARD_DIR), last_step, warn)


class MetricWriter:
    """Appends one JSON object per call to DIR/metrics.jsonl and the same scalars to
    TensorBoard under DIR/tensorboard. A no-op on processes other than 0."""

    def __init__(self, workdir: str):
        self.enabled, self._workdir = jax.process_index() == 0, workdir
        if not self.enabled:
            return
        files.makedirs(workdir)
        self._jsonl = files.AppendedFile(files.path(workdir) / METRICS_FILE)
        self._events = None  # created by the first write, so a run that logs nothing has none

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
        self._jsonl.write((json.dumps(record) + "\n").encode("utf-8"))
        if self._events is None:
            self._events = events.EventFile(os.path.join(self._workdir, TENSORBOARD_DIR))
        self._events.scalars(step, scalars)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._events is not None:
                self._events.close()


class Console:
    """Progress lines and messages on stdout, unless quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or jax.process_index() != 0

    def print(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stdout, flush=True)


def mean_metrics(history: list[dict[str, float]]) -> dict[str, float]:
    """Per-step metrics averaged over a logging interval."""
    return {k: float(np.mean([h[k] for h in history])) for k in history[0]}


class TrainingLog:
    """Per-step device metrics -> log records (the mean over each `log_every` steps, with
    sequences/s and MFU once a rate is measured), console lines, and the divergence stop."""

    def __init__(self, workdir: str, total_steps: int, log_every: int, seq_per_step: int,
                 flops_per_step: float, peak_flops: float, quiet: bool, window: list):
        self.writer = MetricWriter(workdir)
        self.console = Console(quiet)
        self.total_steps, self.log_every = total_steps, log_every
        self.seq_per_step, self.flops_per_step, self.peak = seq_per_step, flops_per_step, peak_flops
        self.window = window  # steps since the last log record; saved with checkpoints
        self.last_good_checkpoint: int | None = None
        self._clock: tuple[int, float] | None = None
        self._rate: float | None = None
        self._examples: list[float] = []  # per step since the last log line (packed rows)

    def restart_clock(self, step: int) -> None:
        """Excludes what happened before now (compilation, eval, saving) from throughput."""
        self._clock = (step, time.perf_counter())

    def diverged(self, what: str, checkpoint_dir: str) -> FloatingPointError:
        last = (f"the last good checkpoint is step {self.last_good_checkpoint} in "
                f"{checkpoint_dir}" if self.last_good_checkpoint is not None
                else "no checkpoint was saved")
        return FloatingPointError(
            f"training diverged: {what}; stopped without saving ({last}). Lower "
            "optimizer.learning_rate, raise the warmup or use float32.")

    def record(self, step: int, device_metrics: dict, checkpoint_dir: str) -> None:
        host = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
        # Packed rows hold several examples: the rate counts them, the log records do not.
        self._examples.append(host.pop("examples", self.seq_per_step))
        if not (np.isfinite(host["loss"]) and np.isfinite(host["grad_norm"])):
            raise self.diverged(f"loss {host['loss']}, grad_norm {host['grad_norm']} at step "
                                f"{step}", checkpoint_dir)
        now = time.perf_counter()
        if self._clock is not None and step > self._clock[0]:
            self._rate = (step - self._clock[0]) / (now - self._clock[1])
        if self._clock is None or step > self._clock[0]:
            self._clock = (step, now)
        self.window.append(host)
        if step % self.log_every == 0 or step == self.total_steps:
            self._log(step)

    def _log(self, step: int) -> None:
        record = mean_metrics(self.window)
        self.window.clear()
        eta = float("inf")
        examples_per_step = float(np.mean(self._examples)) if self._examples else self.seq_per_step
        self._examples.clear()
        if self._rate:
            record["seq_per_sec"] = self._rate * examples_per_step
            record["mfu"] = self._rate * self.flops_per_step / self.peak
            eta = (self.total_steps - step) / self._rate
        self.writer.write(step, record)
        self.console.print(progress_line(step, self.total_steps, record, eta))

    def eval_record(self, step: int, metrics: dict, prefix: str = "eval_",
                    heading: str = "") -> None:
        """An evaluation's numbers to the writers (named `prefix` + metric), and a line."""
        self.writer.write(step, {prefix + k: v for k, v in metrics.items()
                                 if isinstance(v, (int, float))})
        self.console.print(f"{heading or f'eval at step {step}'}: " + " | ".join(
            f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)))

    def close(self) -> None:
        self.writer.close()
