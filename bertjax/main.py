"""`python -m bertjax.main --config=configs/base.py --workdir=DIR`: runs what `config.mode` says.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/tiny \\
      --config.data.shard_dir=/tmp/austen --config.optimizer.learning_rate=2e-4

Config files are ml_collections files with `get_config()`, loaded locked: an override of a
key that does not exist is an error.

On several hosts every host runs the same command, and `jax.distributed.initialize()` joins
them (the contract `launch/` relies on):
  - with BERTJAX_COORDINATOR_ADDRESS (host:port of process 0), BERTJAX_NUM_PROCESSES and
    BERTJAX_PROCESS_ID set, with those (Cloud Batch, or processes started by hand);
  - on a Cloud TPU VM, or where JAX_COORDINATOR_ADDRESS, Slurm or Open MPI show several
    processes, without arguments: JAX finds the other hosts itself;
  - nowhere else: a single host skips it. `--distributed=on|off` forces the choice.
"""

from __future__ import annotations

import difflib
import glob
import importlib
import importlib.util
import math
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import cli, host_memory

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py), optionally with ':arg'.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, model.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "jax.distributed.initialize(): 'auto' when the environment shows several processes or a "
    "Cloud TPU VM, 'on' always, 'off' never.")
_HOST_MEMORY = flags.DEFINE_enum(
    "host_memory", "keep", ["keep", "release"],
    "'keep': freed host memory stays with the process for the next step to reuse (glibc; "
    "see bertjax/host_memory.py); 'release': the C library's default, which returns large "
    "blocks to the system and faults them in again every step.")

_COMPILE_ONLY = flags.DEFINE_string(
    "compile_only", None,
    "Compile the run's train and eval steps ahead of time for a TPU slice, given as a Cloud "
    "TPU accelerator type (v4-8, v5litepod-16, v5p-8, v6e-8) or a topology (v5e:4x4, "
    "v4:2x2x2), and print the memory and FLOPs per chip; exit 1 with one line when it does "
    "not fit. Nothing runs and nothing is written; --workdir is not needed. Needs libtpu "
    "(Linux x86_64; the test extra installs it).")
_LARGEST_BATCH = flags.DEFINE_bool(
    "largest_batch", False,
    "With --compile_only: also find the largest global batch that fits, by compiling.")

# config.mode -> "module:function(config, workdir)"; imported only when chosen.
MODES = {
    "pretrain": "bertjax.training.pretrain:run",
    "finetune": "bertjax.training.finetune:run",  # configs/finetune/*.py
}

# Variables that launchers of several processes set (value: more than one process).
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_ENV_ADDRESS, _ENV_COUNT, _ENV_ID = ("BERTJAX_COORDINATOR_ADDRESS", "BERTJAX_NUM_PROCESSES",
                                     "BERTJAX_PROCESS_ID")


def _on_cloud_tpu_vm() -> bool:
    # JAX's own test: TPU device files, and libtpu installed.
    devices = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    return bool(devices) and importlib.util.find_spec("libtpu") is not None


def _cluster_detected() -> bool:
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if any(int(os.environ.get(v, "1") or 1) > 1 for v in _CLUSTER_SIZE_VARS):
        return True
    return _on_cloud_tpu_vm()


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None


def initialize_distributed(mode: str = "auto") -> None:
    """Joins the processes of a multi-host run into one JAX runtime (before any JAX use)."""
    import jax
    if mode == "off":
        return
    if os.environ.get(_ENV_COUNT):
        address = os.environ.get(_ENV_ADDRESS, "")
        count, index = _env_int(_ENV_COUNT), _env_int(_ENV_ID)
        if not address or count < 1 or not 0 <= index < count:
            raise ValueError(f"{_ENV_COUNT}={count} needs {_ENV_ADDRESS}=host:port and "
                             f"0 <= {_ENV_ID} < {count}; got {_ENV_ADDRESS}={address!r}, "
                             f"{_ENV_ID}={index}")
        # CPU processes exchange collectives over gloo; accelerators ignore this setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=address, num_processes=count,
                                   process_id=index)
    elif mode == "on" or _cluster_detected():
        jax.distributed.initialize()


def _unknown_override(argv: list[str], config) -> str | None:
    """Names the first --config.a.b override whose key the config lacks, with suggestions."""
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        path = arg[len("--config."):].split("=", 1)[0]
        node, done = config, []
        for part in path.split("."):
            if not hasattr(node, "keys"):
                return f"--config.{path}: {'.'.join(done)} is a value, not a group of keys"
            keys = list(node.keys())
            if part not in keys:
                where = ".".join(done) or "the config"
                close = difflib.get_close_matches(part, keys, n=3)
                hint = (f"did you mean {', '.join(close)}?" if close
                        else f"{where} has: {', '.join(sorted(keys))}")
                return (f"{arg.split('=', 1)[0]}: {where} has no key {part!r} (every key "
                        f"must exist in the config file); {hint}")
            node, done = node[part], done + [part]
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a one-line error for a config file that is not there and for an
    override of a key the config lacks."""
    for arg in argv:
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1].split(":", 1)[0]
            if not os.path.isfile(path):
                sys.exit(f"bertjax.main: error: --config={path}: no such config file "
                         f"(configs/ lives in the bertjax checkout; run from there or give a "
                         f"full path)")
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError):
        config_args = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
        if not config_args:
            raise
        config = flags.FLAGS["config"].parser.parse(config_args[-1])
        message = _unknown_override(argv, config)
        if message is None:
            raise
        sys.exit(f"bertjax.main: error: {message}")


def run_mode(config, workdir: str) -> dict:
    """Runs `config.mode`; returns the run's result ('preempted' says whether a signal
    stopped it after saving)."""
    if config.mode not in MODES:
        raise ValueError(f"config.mode {config.mode!r}: expected one of {', '.join(MODES)}")
    if config.train.compilation_cache_dir:
        import jax
        jax.config.update("jax_compilation_cache_dir", config.train.compilation_cache_dir)
    module, function = MODES[config.mode].split(":")
    return getattr(importlib.import_module(module), function)(config, workdir)


def compile_only(config, slice_name: str, largest: bool) -> None:
    """--compile_only: the TPU plan of the run (training/plan.py), printed; a run that does
    not fit is an error naming its largest term."""
    from bertjax.training import plan as plan_lib

    print(f"compiling {config.mode} steps for {slice_name} with XLA:TPU on this machine...",
          flush=True)
    plan = plan_lib.compile_plan(config, slice_name)
    print(plan_lib.table(plan), flush=True)
    accumulation = config.optimizer.grad_accum_steps
    if largest:
        shards = plan.mesh_shape["data"] * plan.mesh_shape["fsdp"]
        granule = math.lcm(shards * accumulation, plan.hosts)
        best, misfit = plan_lib.largest_batch(config, slice_name, plan, granule)
        above = f"; {misfit} does not fit" if misfit else ""
        print(f"largest global batch found to fit {plan.tpu.name}: {best.global_batch_size} "
              f"({plan_lib.size(best.largest.total_bytes)} per chip{above}; batches are "
              f"multiples of {granule})", flush=True)
    if not plan.fits:
        raise ValueError(plan_lib.refusal(plan, accumulation))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if _COMPILE_ONLY.value:
        # The programs are compiled for the slice's devices; this process computes nothing,
        # and there may be no TPU (or a different one) where it runs.
        import jax
        jax.config.update("jax_platforms", "cpu")
        with cli.one_line_errors("bertjax.main"):
            compile_only(_CONFIG.value, _COMPILE_ONLY.value, _LARGEST_BATCH.value)
        return
    if _LARGEST_BATCH.value:
        raise app.UsageError("--largest_batch goes with --compile_only")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required (except with --compile_only)")
    if not flags.FLAGS["verbosity"].present:
        # Orbax logs every save at INFO; our progress lines say what matters.
        logging.set_verbosity(logging.WARNING)
    if _HOST_MEMORY.value == "keep":  # before JAX starts its CPU runtime's threads
        host_memory.keep_freed_memory()
    with cli.one_line_errors("bertjax.main"):
        initialize_distributed(_DISTRIBUTED.value)
        result = run_mode(_CONFIG.value, _WORKDIR.value)
    if result.get("preempted"):
        sys.exit(cli.PREEMPTED)


if __name__ == "__main__":
    import jax
    jax.config.config_with_absl()  # JAX's own flags too: --jax_platforms=cpu, ...
    flags.mark_flags_as_required(["config"])
    app.run(main, flags_parser=parse_flags)
