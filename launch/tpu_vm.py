"""Run bertjax.main on a Cloud TPU VM slice: create, install, start detached, watch, delete.

    .venv/bin/python launch/tpu_vm.py --project=P --zone=us-central2-b \\
        --accelerator_type=v4-32 --config=configs/base.py --workdir=gs://BUCKET/run1 \\
        --spot --retries=5 -- --config.data.shard_dir=gs://BUCKET/corpus

Everything after `--` is passed to `python -m bertjax.main` unchanged (quoted for the remote
shell), after the launcher parsed it with bertjax.main's own parser: a bad key fails here,
before any TPU exists. Then the TPU plan (`python -m bertjax.main --compile_only=TYPE`)
compiles the run for --accelerator_type here, without a TPU, and a run that does not fit the
slice's memory is refused before anything is created (--skip_plan skips it). Every worker of
the slice runs the same command, started under `nohup setsid` so it belongs to no ssh
session: the launcher then polls the workers over short ssh calls and prints worker 0's new
log lines, and a dropped connection only delays the next poll. Each worker copies its log to
WORKDIR/logs/. A run that fails because the slice was preempted gets a new slice and the same
command (--retries): the workdir is the same, so the trainer resumes from its last
checkpoint. Ctrl-C while the run is going stops the watching only; `--attach` watches it
again. --dry_run prints the commands of one attempt.
See launch/README.md.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
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
flags.DEFINE_bool("reserved", False, "Use the project's TPU reservation (gcloud's --reserved).")
flags.DEFINE_bool("queued_resource", False, "Request the slice through a queued resource, "
                  "which waits for capacity instead of failing when none is free.")
flags.DEFINE_bool("keep", False, "Do not delete the TPU at the end (to inspect or rerun).")
flags.DEFINE_bool("skip_plan", False, "Do not run the TPU plan (`python -m bertjax.main "
                  "--compile_only=ACCELERATOR_TYPE`), which compiles the run for the slice here "
                  "and refuses one that does not fit before any TPU is created.")
flags.DEFINE_bool("attach", False, "Watch a run this launcher started earlier on the TPU "
                  "--name (after Ctrl-C, or from another machine) instead of starting one; "
                  "needs only --name, --zone and --project, and --queued_resource and "
                  "--internal_ip when the run was started with them.")

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
_RUN_DIR = "$HOME/bertjax-run"
# A poll whose ssh hangs (half-open connection) counts as a failed poll.
_POLL_TIMEOUT_SECONDS = 300
# How long stopped workers get to save a checkpoint and their logs before the slice goes.
_STOP_WAIT_SECONDS = 600
# How often each worker copies its log to the workdir while the run goes on.
_LOG_COPY_SECONDS = 300
_STATUS_RE = re.compile(r"^bertjax-status (\S+) (\S+)$", re.M)
_METADATA = ("http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
             "agent-worker-number")


def plan_command(config: str, accelerator_type: str, overrides: list[str]) -> list[str]:
    """bertjax.main's plan of the run for ACCELERATOR_TYPE: the config and its --config.*
    overrides, which decide the program; the other flags after `--` (JAX's, --distributed)
    are for the workers' runtime."""
    given, follows_key = [], False
    for arg in overrides:
        # `--config.x.y VALUE` gives the value as the next argument.
        if arg.startswith("--config.") or (follows_key and not arg.startswith("-")):
            given.append(arg)
            follows_key = arg.startswith("--config.") and "=" not in arg
        else:
            follows_key = False
    return [sys.executable, "-m", "bertjax.main", f"--config={config}",
            f"--compile_only={accelerator_type}", *given]


def run_plan(runner: Runner, config: str, accelerator_type: str, overrides: list[str]) -> None:
    """Compiles the run for the slice here (no TPU needed: libtpu compiles for a topology) and
    shows the plan's table; a run that does not fit stops the launch before anything exists."""
    command = plan_command(config, accelerator_type, overrides)
    shown = shlex.join(["python", *command[1:]])
    if not runner.dry_run:
        print(f"+ {shown}", file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=launchlib.REPO_ROOT, capture_output=True, text=True,
                            check=False, env=launchlib.child_env())
    if result.returncode != 0:
        missing = launchlib.missing_module(result.stderr)
        reason = missing or launchlib.error_line(result.stderr, result.returncode)
        # The command, so the plan's whole table is one paste away.
        raise LaunchError(f"the TPU plan of --config={config} for "
                          f"--accelerator_type={accelerator_type} failed: {reason} (`{shown}`; "
                          "--skip_plan launches without the plan)")
    runner.note(f"the TPU plan, run here before anything is created (--skip_plan skips it): "
                f"{shown}\n{result.stdout.rstrip()}")


def runtime_version(accelerator_type: str, given: str | None) -> str:
    if given:
        return given
    generation = accelerator_type.rsplit("-", 1)[0]
    if generation not in _RUNTIME_BY_GENERATION:
        raise LaunchError(f"no default runtime for --accelerator_type={accelerator_type}: pass "
                          "--runtime_version (see `gcloud compute tpus tpu-vm versions list`)")
    return _RUNTIME_BY_GENERATION[generation]


def copy_command(source: str, destination: str) -> str:
    """Worker-side shell that copies SOURCE (a worker path) to DESTINATION (gs:// or local)."""
    if destination.startswith("gs://"):
        return f"gcloud storage cp --quiet {source} {destination}"
    return f"mkdir -p $(dirname {destination}) && cp {source} {destination}"


def start_command(env: dict[str, str], command: list[str], log_dir: str) -> str:
    """Shell line that starts bertjax.main on a worker in its own session and returns at once.

    The run belongs to no ssh session, so a dropped connection cannot hang it up. Its output
    goes to $HOME/bertjax-run/worker.log, copied to LOG_DIR/worker-N.log every few minutes and
    at the end; its exit status lands in exit_code, and `started` makes a repeated start (an
    ssh retry) a no-op.
    """
    steps = launchlib.worker_run(_BASE, env, command)
    # exec: the recorded pid is then bertjax.main's own, which STOP_COMMAND signals.
    run = " && ".join([*steps[:-1], "exec " + steps[-1]])
    destination = f'{shlex.quote(log_dir.rstrip("/"))}/worker-"$W".log'
    # One line, so a dry run prints the whole command on one line.
    script = "; ".join([
        f'R="{_RUN_DIR}"',
        f"W=$(curl -sf -m 10 -H Metadata-Flavor:Google {_METADATA}); W=${{W:-$(hostname)}}",
        'echo "$W" > "$R/worker_id"',
        f'save_log() {{ {copy_command("$R/worker.log", destination)}; }}',
        f"( while sleep {_LOG_COPY_SECONDS}; do save_log; done ) & saver=$!",
        f'( {run} ) > "$R/worker.log" 2>&1 & echo $! > "$R/pid"',
        "wait $!; code=$?",
        # The copier's sleep first, so that it does not outlive the run by minutes.
        "pkill -P $saver; kill $saver 2>/dev/null; save_log",
        'echo $code > "$R/exit_code.tmp" && mv "$R/exit_code.tmp" "$R/exit_code"',
    ])
    return (f'mkdir -p "{_RUN_DIR}" && cd "{_RUN_DIR}" && if [ ! -e started ]; then '
            f"touch started && (setsid nohup bash -c {shlex.quote(script)} "
            "> /dev/null 2>&1 < /dev/null &); fi")


STATUS_COMMAND = (f'echo "bertjax-status $(cat {_RUN_DIR}/worker_id 2>/dev/null || echo -) '
                  f'$(cat {_RUN_DIR}/exit_code 2>/dev/null || echo running)"')
# SIGTERM, which bertjax.main answers by saving a checkpoint before it exits.
STOP_COMMAND = f'if [ -e {_RUN_DIR}/pid ]; then kill -TERM "$(cat {_RUN_DIR}/pid)"; fi; true'


def log_command(lines_seen: int) -> str:
    return f"tail -n +{lines_seen + 1} {_RUN_DIR}/worker.log 2>/dev/null; true"


class TpuSlice:
    """The gcloud commands for one named TPU slice, created directly or via a queued resource."""

    def __init__(self, runner: Runner, name: str, project: str, zone: str, queued: bool,
                 internal_ip: bool = False):
        self.runner, self.name, self.queued = runner, name, queued
        self.project, self.zone, self.internal_ip = project, zone, internal_ip
        self.where = [f"--project={project}", f"--zone={zone}"]
        kind = "queued-resources" if self.queued else "tpu-vm"
        self.gcloud = ["gcloud", "compute", "tpus", kind]
        self.tpu_vm = ["gcloud", "compute", "tpus", "tpu-vm"]
        # A slice recreated under the same name has new host keys: with strict checking ssh
        # would refuse it ("REMOTE HOST IDENTIFICATION HAS CHANGED").
        self.ssh_options = ["--strict-host-key-checking=no",
                            *(["--internal-ip"] if internal_ip else [])]
        self.created = False
        # Set when Ctrl-C left a started run going: the slice must then outlive the launcher.
        self.detached = False

    def check_absent(self) -> None:
        """Refuses a name in use: the launcher deletes what it created, never a stranger's TPU."""
        found = self.runner.output(self.state_query(), show_errors=False)
        if self.runner.dry_run:
            self.runner.note("(must fail with NOT_FOUND: the name is free)")
        elif found is not None:
            raise LaunchError(f"{' '.join(self.gcloud[3:])} {self.name} already exists in "
                              f"{self.where[1]}: pick another --name, or delete it first")

    def create(self, accelerator_type: str, version: str, options: list[str]) -> int:
        """OPTIONS: capacity (--spot, --preemptible, --reserved), network, service account."""
        self.created = True
        if not self.queued:
            return self.runner.run([*self.gcloud, "create", self.name, *self.where,
                                    f"--accelerator-type={accelerator_type}",
                                    f"--version={version}", *options])
        status = self.runner.run([*self.gcloud, "create", self.name, *self.where,
                                  f"--accelerator-type={accelerator_type}",
                                  f"--runtime-version={version}", f"--node-id={self.name}",
                                  *options])
        return status if status != 0 else self._wait_active()

    def _wait_active(self) -> int:
        query = [*self.gcloud, "describe", self.name, *self.where, "--format=value(state.state)"]
        if self.runner.dry_run:
            self.runner.output(query)
            self.runner.note(f"(repeated every {FLAGS.poll_seconds:g} s until the state is "
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
            time.sleep(FLAGS.poll_seconds)

    def worker_count(self) -> int | None:
        """Hosts in the slice (one network endpoint each); None when the query fails."""
        found = self.runner.output([*self.tpu_vm, "describe", self.name, *self.where,
                                    "--format=json"])
        if found is None:
            return None
        return len(json.loads(found).get("networkEndpoints", [])) or None

    def scp_to_all(self, local: Path, remote: str) -> int:
        return self.runner.run_retried(
            [*self.tpu_vm, "scp", str(local), f"{self.name}:{remote}", *self.where,
             "--worker=all", *self.ssh_options], "copying the code", any_failure=True)

    def ssh(self, command: str, worker: str = "all") -> list[str]:
        return [*self.tpu_vm, "ssh", self.name, *self.where, f"--worker={worker}",
                *self.ssh_options, f"--command={command}"]

    def ssh_all(self, command: str, what: str) -> int:
        """Runs COMMAND on every worker at once, again while ssh itself fails."""
        return self.runner.run_retried(self.ssh(command), what)

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
        self.created = False
        return self.runner.run(self.delete_command())


class Preempted(Exception):
    """The slice was taken back while the run was going."""


def watch(tpu: TpuSlice, workers: int | None) -> int:
    """Polls the workers until every one has an exit status; prints worker 0's new log lines.

    A poll that fails (a dropped connection, ssh timing out) changes nothing on the workers:
    the launcher asks for the slice's state and, unless it was preempted, polls again. The
    first worker that fails stops the others (SIGTERM, so they save a checkpoint first) and
    ends the run; a run that failed because the slice was preempted raises Preempted.
    """
    runner, lines_seen = tpu.runner, 0
    if runner.dry_run:
        runner.output(tpu.ssh(STATUS_COMMAND))
        runner.output(tpu.ssh(log_command(0), worker="0"))
        runner.note(f"(both repeated every {FLAGS.poll_seconds:g} s until every worker printed "
                    "an exit code: the second prints worker 0's new log lines)")
        return 0
    while True:
        # The status first: log lines fetched after it include everything a finished run wrote.
        status = runner.output(tpu.ssh(STATUS_COMMAND), show_errors=False,
                               timeout=_POLL_TIMEOUT_SECONDS, echo=False)
        codes = dict(_STATUS_RE.findall(status or ""))
        new = runner.output(tpu.ssh(log_command(lines_seen), worker="0"), show_errors=False,
                            timeout=_POLL_TIMEOUT_SECONDS, strip=False, echo=False)
        if new:
            complete = new.splitlines(keepends=True)
            if not complete[-1].endswith("\n"):
                complete.pop()  # still being written: printed whole at the next poll
            print("".join(complete), end="", flush=True)
            lines_seen += len(complete)
        if status is None or (workers and len(codes) < workers):
            if tpu.preempted():
                raise Preempted()
            runner.note(f"no answer from every worker of {tpu.name}; the run goes on there, "
                        f"asking again in {FLAGS.poll_seconds:g} s")
        else:
            failed = {w: int(c) for w, c in codes.items() if c != "running" and c != "0"}
            if failed and set(failed.values()) == {launchlib.RUN_STOPPED_TO_RESUME} and all(
                    c != "running" for c in codes.values()):
                return launchlib.RUN_STOPPED_TO_RESUME  # saved after a signal: resume it
            if failed:
                if tpu.preempted():
                    raise Preempted()
                return _stop_after_failure(tpu, failed, len(codes))
            if all(c == "0" for c in codes.values()):
                return 0
        time.sleep(FLAGS.poll_seconds)


def _stop_after_failure(tpu: TpuSlice, failed: dict[str, int], workers: int) -> int:
    """Stops the workers still running (they would wait for the failed one until JAX's
    timeouts), waits until they have saved their checkpoints and logs, and shows the end of a
    failed worker's log."""
    worker, code = sorted(failed.items())[0]
    tpu.runner.note(f"worker {worker} of {tpu.name} exited with {code}: stopping the others")
    tpu.runner.run(tpu.ssh(STOP_COMMAND))
    deadline = time.monotonic() + _STOP_WAIT_SECONDS
    while time.monotonic() < deadline:
        status = tpu.runner.output(tpu.ssh(STATUS_COMMAND), show_errors=False,
                                   timeout=_POLL_TIMEOUT_SECONDS, echo=False)
        codes = dict(_STATUS_RE.findall(status or ""))
        if len(codes) >= workers and "running" not in codes.values():
            break
        time.sleep(FLAGS.poll_seconds)
    if worker.isdigit():
        tail = tpu.runner.output(tpu.ssh(f"tail -n 40 {_RUN_DIR}/worker.log", worker=worker),
                                 show_errors=False, timeout=_POLL_TIMEOUT_SECONDS)
        if tail:
            tpu.runner.note(f"the end of worker {worker}'s log:\n{tail}")
    return code


def attempt(tpu: TpuSlice, create_args: tuple[str, str, list[str]], tarball: Path | None,
            setup: str, start: str) -> int:
    """One try: slice up, code installed on every worker, run started, watched to its end."""
    steps = [lambda: tpu.create(*create_args)]
    if tarball is not None:
        steps.append(lambda: tpu.scp_to_all(tarball, launchlib.ARCHIVE_NAME))
    steps += [lambda: tpu.ssh_all(setup, "installing bertjax"),
              lambda: tpu.ssh_all(start, "starting the run")]
    for step in steps:
        status = step()
        if status != 0:
            return status
    return watch(tpu, tpu.worker_count() if not tpu.runner.dry_run else None)


def create_options() -> list[str]:
    capacity = ["--spot"] if FLAGS.spot else ["--preemptible"] if FLAGS.preemptible else []
    if FLAGS.reserved:
        capacity.append("--reserved")
    network = [f"--{name}={value}" for name, value in (
        ("network", FLAGS.network), ("subnetwork", FLAGS.subnetwork),
        ("service-account", FLAGS.service_account)) if value]
    return capacity + network + (["--internal-ips"] if FLAGS.internal_ip else [])


def launch(overrides: list[str]) -> int:
    zone = launchlib.require(FLAGS.zone, "zone", "ZONE (e.g. us-central2-b)")
    if FLAGS.attach:
        return attach(zone)
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
    launchlib.check_config(FLAGS.config, FLAGS.workdir, overrides)
    launchlib.check_config_in_source(FLAGS.source, FLAGS.ref, FLAGS.config)

    runner = Runner(FLAGS.dry_run, FLAGS.poll_seconds)
    project = launchlib.resolve_project(FLAGS.project, runner)
    # Last of the checks: it compiles (seconds for a small model, minutes for a large one).
    if not FLAGS.skip_plan:
        run_plan(runner, FLAGS.config, accelerator_type, overrides)
    if runner.dry_run:
        runner.note("dry run: these commands would run, in this order; none is run")
    tarball = launchlib.archive_source(runner, FLAGS.ref) if FLAGS.source == "local" else None
    setup = launchlib.worker_setup(_BASE, FLAGS.source, FLAGS.git_url, FLAGS.ref,
                                   f"{_BASE}/{launchlib.ARCHIVE_NAME}", "tpu", FLAGS.python_version)
    tpu = TpuSlice(runner, name, project, zone, FLAGS.queued_resource, FLAGS.internal_ip)

    tpu.check_absent()
    status = 1
    try:
        for tries in range(FLAGS.retries + 1):
            log_dir = f"{FLAGS.workdir.rstrip('/')}/logs/{name}-{tries}"
            start = start_command(env, command, log_dir)
            try:
                status = attempt(tpu, (accelerator_type, version, create_options()), tarball,
                                 setup, start)
            except Preempted:
                status = launchlib.SSH_FAILED
            if runner.dry_run:
                runner.note(f"each worker's log is copied to {log_dir}/worker-N.log")
                _note_retry(tpu)
                break
            if status == 0 or tries == FLAGS.retries or (
                    status != launchlib.RUN_STOPPED_TO_RESUME and not tpu.preempted()):
                break
            why = ("stopped after saving" if status == launchlib.RUN_STOPPED_TO_RESUME
                   else "was preempted")
            runner.note(f"{name} {why}: retry {tries + 1} of {FLAGS.retries} with a new "
                        f"slice; training resumes from the checkpoints in {FLAGS.workdir}")
            tpu.delete()
    except KeyboardInterrupt:
        if tpu.created and _started(tpu):
            _note_detached(tpu)
            return 130
        raise
    finally:
        if FLAGS.keep and tpu.created:
            runner.note(f"--keep: {name} is left running; delete it with: "
                        f"{shlex.join(tpu.delete_command())}")
        elif tpu.created and not tpu.detached:
            tpu.delete()
    return status


def _started(tpu: TpuSlice) -> bool:
    """Whether the run was started on the workers (then Ctrl-C must not end it)."""
    found = tpu.runner.output(tpu.ssh(f"ls {_RUN_DIR}/started", worker="0"), show_errors=False,
                              timeout=60)
    tpu.detached = found is not None
    return tpu.detached


def attach_command(tpu: TpuSlice) -> list[str]:
    """The launcher command that watches TPU's run again: every flag that finds the slice
    (a queued resource is described and deleted as one) and reaches it (by internal IPs),
    and --keep, so the TPU outlives the run as the first command asked."""
    return ["python", "launch/tpu_vm.py", "--attach", f"--name={tpu.name}",
            f"--zone={tpu.zone}", f"--project={tpu.project}",
            *(["--queued_resource"] if tpu.queued else []),
            *(["--internal_ip"] if tpu.internal_ip else []),
            *(["--keep"] if FLAGS.keep else [])]


def _note_detached(tpu: TpuSlice) -> None:
    then = "" if FLAGS.keep else " (and delete the TPU when it ends)"
    tpu.runner.note(
        f"stopped watching; the run goes on on {tpu.name}. Watch it again{then} with: "
        f"{shlex.join(attach_command(tpu))}\nor delete it now with: "
        f"{shlex.join(tpu.delete_command())}")


def attach(zone: str) -> int:
    if not FLAGS.name:
        raise LaunchError("missing --name: --attach watches the run on the TPU of that name")
    name = launchlib.check_name(FLAGS.name)
    runner = Runner(FLAGS.dry_run, FLAGS.poll_seconds)
    project = launchlib.resolve_project(FLAGS.project, runner)
    tpu = TpuSlice(runner, name, project, zone, FLAGS.queued_resource, FLAGS.internal_ip)
    tpu.created = True
    try:
        status = watch(tpu, None if runner.dry_run else tpu.worker_count())
    except Preempted:
        runner.note(f"{name} was preempted; start the run again with the launcher's first "
                    "command (same --workdir: it resumes from the last checkpoint)")
        status = launchlib.SSH_FAILED
    except KeyboardInterrupt:
        _note_detached(tpu)
        return 130
    if FLAGS.keep:
        runner.note(f"--keep: {name} is left running; delete it with: "
                    f"{shlex.join(tpu.delete_command())}")
    else:
        tpu.delete()
    return status


def _note_retry(tpu: TpuSlice) -> None:
    if FLAGS.retries == 0:
        tpu.runner.note("--retries=0: a preempted run is not restarted")
        return
    states = _PREEMPTED_QR_STATES if tpu.queued else _PREEMPTED_VM_STATES
    tpu.runner.note(
        f"if a step or a poll fails: {shlex.join(tpu.state_query())}\n"
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
