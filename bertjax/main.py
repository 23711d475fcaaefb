"""`python -m bertjax.main --config=configs/base.py --workdir=DIR`: runs what `config.mode` says.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/tiny \\
      --config.data.shard_dir=/tmp/austen --config.optimizer.learning_rate=2e-4

Config files are ml_collections files with `get_config()`, loaded locked: an override of a
key that does not exist is an error. On several hosts, every host runs the same command;
`jax.distributed.initialize()` is called when a cluster is detected (Slurm, Open MPI,
JAX_COORDINATOR_ADDRESS, GKE TPU) or with `--distributed=on` (Cloud TPU pod slices), or with
an explicit `--coordinator_address/--num_processes/--process_id`. On one host it is skipped.
"""

from __future__ import annotations

import importlib
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py), optionally with ':arg'.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, model.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "jax.distributed.initialize(): 'auto' when the environment shows several processes, "
    "'on' always (JAX finds the cluster itself, e.g. on TPU pod slices), 'off' never.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0, for launching processes by hand.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "With --coordinator_address.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "With --coordinator_address.")

# config.mode -> "module:function(config, workdir)"; imported only when chosen.
MODES = {
    "pretrain": "bertjax.training.pretrain:run",
}

# Variables that launchers of several processes set (value: more than one process).
_CLUSTER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _cluster_detected() -> bool:
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if any(int(os.environ.get(v, "1") or 1) > 1 for v in _CLUSTER_SIZE_VARS):
        return True
    return len(os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",")) > 1


def initialize_distributed(mode: str, coordinator_address: str = "", num_processes: int = 0,
                           process_id: int = -1) -> None:
    """Joins the processes of a multi-host run into one JAX runtime (before any JAX use)."""
    import jax
    if coordinator_address or mode == "on" or (mode == "auto" and _cluster_detected()):
        # CPU processes exchange collectives over gloo; accelerators ignore this setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address:
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError(f"--coordinator_address needs --num_processes >= 1 and "
                             f"0 <= --process_id < num_processes, got {num_processes} and "
                             f"{process_id}")
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id)
    elif mode == "on" or (mode == "auto" and _cluster_detected()):
        jax.distributed.initialize()


def run_mode(config, workdir: str) -> None:
    if config.mode not in MODES:
        raise ValueError(f"config.mode {config.mode!r}: expected one of {', '.join(MODES)}")
    module, function = MODES[config.mode].split(":")
    getattr(importlib.import_module(module), function)(config, workdir)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        initialize_distributed(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                               _PROCESS_ID.value)
        run_mode(_CONFIG.value, _WORKDIR.value)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        sys.exit(f"bertjax.main: error: {e}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
