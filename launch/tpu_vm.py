"""Run bertjax.main on a Cloud TPU VM slice: create, install, run on all workers, delete.

    python launch/tpu_vm.py --project=P --zone=us-central2-b --accelerator_type=v4-32 \\
        --config=configs/base.py --workdir=gs://BUCKET/run1 --spot --retries=5 \\
        -- --config.optimizer.learning_rate=2e-4

Everything after `--` is passed to `python -m bertjax.main` unchanged (quoted for the remote
shell). Every worker of the slice runs the same command; `jax.distributed.initialize()` finds
the other hosts by itself on a TPU slice. With --spot/--preemptible and --retries=N, a run
that fails because the slice was preempted gets a new slice and the same command: the workdir
is the same, so the trainer resumes from its last checkpoint. --dry_run prints the commands
of one attempt. See launch/README.md.
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from absl import app, flags

import launchlib
from launchlib import LaunchError, Runner

flags.DEFINE_string("zone", None, "Zone of the TPU, e.g. us-central2-b.")
flags.DEFINE_string("accelerator_type", None, "TPU slice, e.g. v4-32, v5litepod-16, v5p-64.")
flags.DEFINE_string("runtime_version", None, "TPU VM image. Default from the accelerator "
                    "generation (v2-v4: tpu-ubuntu2204-base, v5e: v2-alpha-tpuv5-lite, v5p: "
                    "v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e).")
flags.DEFINE_bool("spot", False, "Spot capacity: cheaper, can be preempted at any time.")
flags.DEFINE_bool("preemptible", False, "Legacy preemptible TPU (direct create only).")
flags.DEFINE_bool("queued_resource", False, "Request the slice through a queued resource, "
                  "which waits for capacity instead of failing when none is free.")
flags.DEFINE_bool("keep", False, "Do not delete the TPU at the end (to inspect or rerun).")

# The shared flags (--project, --config, --workdir, ...) show in this script's --help.
flags.adopt_module_key_flags(launchlib)
FLAGS = flags.FLAGS

# The image only brings the OS and the TPU driver; jax and libtpu come from the pinned install.
_RUNTIME_BY_GENERATION = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
# States a TPU is left in when Google took it back; anything else is our program failing.
_PREEMPTED_VM_STATES = {"PREEMPTED", "TERMINATED"}
_PREEMPTED_QR_STATES = {"SUSPENDING", "SUSPENDED"}
_QR_FAILED_STATES = {"FAILED", "SUSPENDING", "SUSPENDED"}
_BASE = "$HOME"


def runtime_version(accelerator_type: str, given: str | None) -> str:
    if given:
        return given
    generation = accelerator_type.rsplit("-", 1)[0]
    if generation not in _RUNTIME_BY_GENERATION:
        raise LaunchError(f"no default runtime for --accelerator_type={accelerator_type}: pass "
                          "--runtime_version (see `gcloud compute tpus tpu-vm versions list`)")
    return _RUNTIME_BY_GENERATION[generation]


class TpuSlice:
    """The gcloud commands for one named TPU slice, created directly or via a queued resource."""

    def __init__(self, runner: Runner, name: str, project: str, zone: str, queued: bool):
        self.runner, self.name, self.queued = runner, name, queued
        self.where = [f"--project={project}", f"--zone={zone}"]
        kind = "queued-resources" if self.queued else "tpu-vm"
        self.gcloud = ["gcloud", "compute", "tpus", kind]
        self.tpu_vm = ["gcloud", "compute", "tpus", "tpu-vm"]
        self.created = False

    def check_absent(self) -> None:
        """Refuses a name in use: the launcher deletes what it created, never a stranger's TPU."""
        found = self.runner.output(self.state_query(), show_errors=False)
        if self.runner.dry_run:
            self.runner.note("(must fail with NOT_FOUND: the name is free)")
        elif found is not None:
            raise LaunchError(f"{' '.join(self.gcloud[3:])} {self.name} already exists in "
                              f"{self.where[1]}: pick another --name, or delete it first")

    def create(self, accelerator_type: str, version: str, capacity: list[str]) -> int:
        """CAPACITY: [], ["--spot"] or ["--preemptible"]."""
        self.created = True
        if not self.queued:
            return self.runner.run([*self.gcloud, "create", self.name, *self.where,
                                    f"--accelerator-type={accelerator_type}",
                                    f"--version={version}", *capacity])
        status = self.runner.run([*self.gcloud, "create", self.name, *self.where,
                                  f"--accelerator-type={accelerator_type}",
                                  f"--runtime-version={version}", f"--node-id={self.name}",
                                  *capacity])
        return status if status != 0 else self._wait_active()

    def _wait_active(self) -> int:
        query = [*self.gcloud, "describe", self.name, *self.where, "--format=value(state.state)"]
        if self.runner.dry_run:
            self.runner.output(query)
            self.runner.note(f"(repeated every {launchlib.POLL_SECONDS} s until the state is "
                             "ACTIVE: a queued resource waits for capacity)")
            return 0
        last = None
        while True:
            state = self.runner.output(query)
            if state != last:
                self.runner.note(f"queued resource {self.name}: {state}")
                last = state
            if state == "ACTIVE":
                return 0
            if state in _QR_FAILED_STATES:
                return 1
            time.sleep(launchlib.POLL_SECONDS)

    def scp_to_all(self, local: Path, remote: str) -> int:
        return self.runner.run([*self.tpu_vm, "scp", str(local), f"{self.name}:{remote}",
                                *self.where, "--worker=all"])

    def ssh_all(self, command: str) -> int:
        """Runs COMMAND on every worker at once; their output streams here, interleaved."""
        return self.runner.run([*self.tpu_vm, "ssh", self.name, *self.where, "--worker=all",
                                f"--command={command}"])

    def state_query(self) -> list[str]:
        field = "state.state" if self.queued else "state"
        return [*self.gcloud, "describe", self.name, *self.where, f"--format=value({field})"]

    def preempted(self) -> bool:
        states = _PREEMPTED_QR_STATES if self.queued else _PREEMPTED_VM_STATES
        return self.runner.output(self.state_query()) in states

    def delete_command(self) -> list[str]:
        force = ["--force"] if self.queued else []
        return [*self.gcloud, "delete", self.name, *self.where, *force, "--quiet"]

    def delete(self) -> int:
        return self.runner.run(self.delete_command())


def attempt(tpu: TpuSlice, create_args: tuple[str, str, list[str]], tarball: Path | None,
            setup: str, run: str) -> int:
    """One try: slice up, code installed on every worker, training run. First failure stops it."""
    steps = [lambda: tpu.create(*create_args)]
    if tarball is not None:
        steps.append(lambda: tpu.scp_to_all(tarball, launchlib.ARCHIVE_NAME))
    steps += [lambda: tpu.ssh_all(setup), lambda: tpu.ssh_all(run)]
    for step in steps:
        status = step()
        if status != 0:
            return status
    return 0


def launch(overrides: list[str]) -> int:
    zone = launchlib.require(FLAGS.zone, "zone", "ZONE (e.g. us-central2-b)")
    accelerator_type = launchlib.require(FLAGS.accelerator_type, "accelerator_type",
                                         "TYPE (e.g. v4-32)")
    launchlib.check_workdir(FLAGS.workdir, FLAGS.allow_local_workdir)
    command = launchlib.main_command(FLAGS.config, FLAGS.workdir, overrides)
    name = launchlib.check_name(FLAGS.name)
    env = launchlib.check_env(FLAGS.env)
    launchlib.check_source(FLAGS.source, FLAGS.git_url)
    version = runtime_version(accelerator_type, FLAGS.runtime_version)
    if FLAGS.spot and FLAGS.preemptible:
        raise LaunchError("--spot and --preemptible both given: pick one (spot is the newer)")
    if FLAGS.preemptible and FLAGS.queued_resource:
        raise LaunchError("--preemptible is not available with --queued_resource: use --spot")
    if FLAGS.retries < 0:
        raise LaunchError(f"--retries={FLAGS.retries}: expected 0 or more")

    runner = Runner(FLAGS.dry_run)
    project = launchlib.resolve_project(FLAGS.project, runner)
    if runner.dry_run:
        runner.note("dry run: these commands would run, in this order; none is run")
    launchlib.check_config_in_source(FLAGS.source, FLAGS.ref, FLAGS.config, runner.dry_run)
    tarball = launchlib.archive_source(runner, FLAGS.ref) if FLAGS.source == "local" else None
    setup = launchlib.worker_setup(_BASE, FLAGS.source, FLAGS.git_url, FLAGS.ref,
                                   f"{_BASE}/{launchlib.ARCHIVE_NAME}", "tpu", FLAGS.python_version)
    run = " && ".join(launchlib.worker_run(_BASE, env, command))
    tpu = TpuSlice(runner, name, project, zone, FLAGS.queued_resource)
    capacity = ["--spot"] if FLAGS.spot else ["--preemptible"] if FLAGS.preemptible else []

    tpu.check_absent()
    status = 1
    try:
        for tries in range(FLAGS.retries + 1):
            status = attempt(tpu, (accelerator_type, version, capacity), tarball, setup, run)
            if runner.dry_run:
                _note_retry(tpu)
                break
            if status == 0 or tries == FLAGS.retries or not tpu.preempted():
                break
            runner.note(f"{name} was preempted: retry {tries + 1} of {FLAGS.retries} with a new "
                        f"slice; training resumes from the checkpoints in {FLAGS.workdir}")
            tpu.delete()
    finally:
        if FLAGS.keep:
            runner.note(f"--keep: {name} is left running; delete it with: "
                        f"{shlex.join(tpu.delete_command())}")
        elif tpu.created:
            tpu.delete()
    return status


def _note_retry(tpu: TpuSlice) -> None:
    if FLAGS.retries == 0:
        tpu.runner.note("--retries=0: a preempted run is not restarted")
        return
    states = _PREEMPTED_QR_STATES if tpu.queued else _PREEMPTED_VM_STATES
    tpu.runner.note(
        f"if a step fails: {shlex.join(tpu.state_query())}\n"
        f"and when that prints {' or '.join(sorted(states))} (up to --retries={FLAGS.retries} "
        "times): delete the slice, then repeat every command above from `create` on, with the "
        "same --workdir, so training resumes from its last checkpoint there")


def main(argv: list[str]) -> int:
    try:
        return launch(argv[1:])
    except LaunchError as error:
        launchlib.fail(str(error))


if __name__ == "__main__":
    app.run(main)
