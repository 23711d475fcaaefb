"""Run bertjax.main on GPU VMs with Cloud Batch: one task per VM, all tasks one JAX job.

    .venv/bin/python launch/gcp_batch.py --project=P --region=us-central1 --num_nodes=2 \\
        --machine_type=a3-highgpu-8g --config=configs/base.py --workdir=gs://BUCKET/run1 \\
        --spot --retries=3 -- --config.data.shard_dir=gs://BUCKET/corpus

The launcher parses the config and the overrides with bertjax.main's own parser, writes the
Batch job JSON to a temp file (printed in a dry run), submits it with `gcloud batch jobs
submit`, and waits for it, printing the tasks' log lines from Cloud Logging as they come.
Everything after `--` is passed to `python -m bertjax.main` unchanged. Every task installs
bertjax, then waits at a barrier for the others, so that no process starts
`jax.distributed.initialize` (which gives up after minutes) while another still installs.
Each task (= VM = JAX process) gets, for
`jax.distributed.initialize`, the environment variables

    BERTJAX_COORDINATOR_ADDRESS  host:port of task 0 (Batch's $BATCH_MAIN_NODE_HOSTNAME)
    BERTJAX_NUM_PROCESSES        number of tasks (--num_nodes)
    BERTJAX_PROCESS_ID           this task's index (Batch's $BATCH_NODE_INDEX)

which bertjax.main passes to `jax.distributed.initialize(coordinator_address,
num_processes, process_id)`. A job that fails because a spot VM was preempted is submitted
again under a new name (up to --retries) with the same workdir, so training resumes from its
last checkpoint. See launch/README.md.
"""
from __future__ import annotations

import json
import re
import shlex
import time

from absl import app, flags

import launchlib
from launchlib import LaunchError, Runner

flags.DEFINE_string("region", None, "Batch region the job runs in, e.g. us-central1.")
flags.DEFINE_list("zones", [], "Zones of the region the VMs may use (default: any).")
flags.DEFINE_integer("num_nodes", 1, "VMs (= Batch tasks = JAX processes).")
flags.DEFINE_string("machine_type", "a3-highgpu-8g", "Compute Engine machine type of each VM.")
flags.DEFINE_string("accelerator_type", None, "GPU type, e.g. nvidia-h100-80gb. Default from "
                    "the machine type for the 8-GPU A2/A3/A4 types.")
flags.DEFINE_integer("accelerator_count", None, "GPUs per VM. Default from the machine type.")
flags.DEFINE_bool("spot", False, "Spot VMs: cheaper, can be preempted at any time.")
flags.DEFINE_string("image", None, "Container image with bertjax installed and configs/ in its "
                    "working directory. Default: no container; the VM image gets the code "
                    "(--source) and a pinned install by the job's script.")
flags.DEFINE_string("container_options", "--network=host --ipc=host", "`docker run` options "
                    "for --image: the host network lets tasks reach each other's coordinator "
                    "and NCCL ports; the host IPC namespace gives NCCL its shared memory.")
flags.DEFINE_string("boot_image", None, "VM boot image for the script path (default: Batch's "
                    "own image, whose GPU driver Batch installs).")
flags.DEFINE_integer("boot_disk_gb", 200, "Boot disk size in GB: CUDA wheels and the "
                     "virtualenv need tens of GB.")
flags.DEFINE_enum("jax_extra", "cuda12", ["cuda12", "cuda13"], "jax extra installed by the "
                  "script path (cuda13 needs an NVIDIA driver >= 580).")
flags.DEFINE_integer("coordinator_port", 8476, "Port of the jax.distributed coordinator on task 0.")
flags.DEFINE_bool("wait", True, "Wait for the job to end (needed for --retries).")
flags.DEFINE_string("reservation", None, "Compute Engine reservation the VMs consume (its name "
                    "or projects/P/zones/Z/reservations/NAME). Default: any matching one.")
flags.DEFINE_bool("collocated", True, "Ask Batch to place the VMs close together (placement "
                  "COLLOCATED), for the all-reduce bandwidth between them.")
flags.DEFINE_string("max_run_duration", "7d", "Longest a task may run (e.g. 90m, 36h, 7d): "
                    "Batch ends a run that hangs instead of billing it forever.")

# The shared flags (--project, --config, --workdir, ...) show in this script's --help.
flags.adopt_module_key_flags(launchlib)
FLAGS = flags.FLAGS

# The GPUs that come with the 8-GPU accelerator-optimized machine types.
_GPUS_BY_MACHINE = {
    "a2-highgpu-8g": ("nvidia-tesla-a100", 8),
    "a2-ultragpu-8g": ("nvidia-a100-80gb", 8),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
}
# Batch's reserved exit code for "the task's VM was preempted".
PREEMPTED_EXIT_CODE = 50001
_BASE = "/opt"
_SOURCE_MOUNT = "/mnt/disks/bertjax-src"
_DONE_STATES = {"SUCCEEDED", "FAILED", "CANCELLED"}
DISTRIBUTED_ENV = ("BERTJAX_COORDINATOR_ADDRESS", "BERTJAX_NUM_PROCESSES", "BERTJAX_PROCESS_ID")
_DURATION_RE = re.compile(r"(\d+)([smhd]?)")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> int:
    found = _DURATION_RE.fullmatch(text.strip())
    if not found or int(found.group(1)) == 0:
        raise LaunchError(f"--max_run_duration={text}: expected a positive duration such as "
                          "90m, 36h or 7d")
    return int(found.group(1)) * _SECONDS[found.group(2)]


def accelerators(machine_type: str, gpu_type: str | None, count: int | None) -> tuple[str, int]:
    if gpu_type is None and count is None and machine_type in _GPUS_BY_MACHINE:
        return _GPUS_BY_MACHINE[machine_type]
    if gpu_type is None or count is None:
        raise LaunchError(f"missing --accelerator_type or --accelerator_count for "
                          f"--machine_type={machine_type}: pass both, e.g. "
                          "--accelerator_type=nvidia-l4 --accelerator_count=1")
    if count < 1:
        raise LaunchError(f"--accelerator_count={count}: expected 1 or more")
    return gpu_type, count


def distributed_exports(port: int) -> list[str]:
    """Task-side lines that turn Batch's per-task variables into bertjax's.

    Batch sets $BATCH_MAIN_NODE_HOSTNAME (task 0's host) and $BATCH_NODE_INDEX only at run
    time, so they are expanded by the task's shell; BERTJAX_NUM_PROCESSES is fixed in the job.
    """
    return [f'export BERTJAX_COORDINATOR_ADDRESS="${{BATCH_MAIN_NODE_HOSTNAME}}:{port}"',
            'export BERTJAX_PROCESS_ID="${BATCH_NODE_INDEX}"']


def runnables(command: list[str], staged: bool) -> list[dict]:
    """What each task runs: the container (--image), or a script that installs and runs."""
    exports = distributed_exports(FLAGS.coordinator_port)
    steps = []
    if FLAGS.num_nodes > 1:
        # Some Batch images drop inbound connections by default; the other tasks must reach
        # this VM's coordinator and NCCL ports. The VPC firewall still guards the network edge.
        steps.append({"displayName": "open-firewall", "script": {
            "text": "if command -v iptables >/dev/null; then iptables -I INPUT -j ACCEPT; fi"}})
    if FLAGS.image:
        steps.append({"displayName": "bertjax", "container": {
            "imageUri": FLAGS.image, "entrypoint": "/bin/bash",
            "commands": ["-c", " && ".join([*exports, shlex.join(command)])],
            "options": FLAGS.container_options}})
        return steps
    tarball = f"{_SOURCE_MOUNT}/{launchlib.ARCHIVE_NAME}" if staged else None
    setup = launchlib.worker_setup(_BASE, FLAGS.source, FLAGS.git_url, FLAGS.ref, tarball,
                                   FLAGS.jax_extra, FLAGS.python_version)
    # uv keeps its downloaded Pythons under $HOME, which Batch may leave unset for root.
    header = ["#!/bin/bash", "set -euo pipefail", 'export HOME="${HOME:-/root}"']
    steps.append({"displayName": "install", "script": {"text": "\n".join([*header, setup, ""])}})
    if FLAGS.num_nodes > 1:
        # Installing takes minutes and not equally long everywhere, and jax.distributed gives
        # up when a process is missing for long: every task starts JAX only once all are ready.
        steps.append({"displayName": "all-installed", "barrier": {"name": "installed"}})
    run = " && ".join(launchlib.worker_run(_BASE, {}, command))
    steps.append({"displayName": "bertjax",
                  "script": {"text": "\n".join([*header, *exports, run, ""])}})
    return steps


def job_config(command: list[str], env: dict[str, str], gpus: tuple[str, int],
               staging: str | None) -> dict:
    """The Batch job this script's flags describe; STAGING is the code's gs:// folder."""
    variables = {**env, "BERTJAX_NUM_PROCESSES": str(FLAGS.num_nodes)}
    task_spec = {
        "runnables": runnables(command, staging is not None),
        "environment": {"variables": variables},
        # A lone retried task could not rejoin the other processes' jax.distributed group:
        # retries resubmit the whole job instead (see launch()).
        "maxRetryCount": 0,
        "maxRunDuration": f"{duration_seconds(FLAGS.max_run_duration)}s",
    }
    if staging is not None:
        task_spec["volumes"] = [{"gcs": {"remotePath": staging.removeprefix("gs://")},
                                 "mountPath": _SOURCE_MOUNT}]
    policy = {
        "machineType": FLAGS.machine_type,
        "accelerators": [{"type": gpus[0], "count": gpus[1]}],
        "provisioningModel": "SPOT" if FLAGS.spot else "STANDARD",
        "bootDisk": {"sizeGb": FLAGS.boot_disk_gb},
    }
    if FLAGS.boot_image:
        policy["bootDisk"]["image"] = FLAGS.boot_image
    if FLAGS.reservation:
        policy["reservation"] = FLAGS.reservation
    allocation = {"instances": [{"installGpuDrivers": True, "policy": policy}]}
    if FLAGS.zones:
        allocation["location"] = {"allowedLocations": [f"zones/{z}" for z in FLAGS.zones]}
    if FLAGS.collocated and FLAGS.num_nodes > 1:
        allocation["placement"] = {"collocation": "COLLOCATED"}
    interface = {key: value for key, value in (
        ("network", FLAGS.network), ("subnetwork", FLAGS.subnetwork)) if value}
    if FLAGS.internal_ip:
        interface["noExternalIpAddress"] = True
    if interface:
        allocation["network"] = {"networkInterfaces": [interface]}
    if FLAGS.service_account:
        allocation["serviceAccount"] = {"email": FLAGS.service_account}
    return {
        "taskGroups": [{
            "taskCount": FLAGS.num_nodes,
            "parallelism": FLAGS.num_nodes,
            "taskCountPerNode": 1,
            # With one task per VM, the multi-node setup in which Batch gives every task
            # $BATCH_MAIN_NODE_HOSTNAME, $BATCH_NODE_INDEX and $BATCH_HOSTS_FILE.
            "requireHostsFile": True,
            "taskSpec": task_spec,
        }],
        "allocationPolicy": allocation,
        "labels": {"launcher": "bertjax"},
        "logsPolicy": {"destination": "CLOUD_LOGGING"},
    }


class BatchJob:
    """The gcloud commands for one job name in one region."""

    def __init__(self, runner: Runner, project: str, region: str):
        self.runner, self.project, self.region = runner, project, region
        self.where = [f"--project={project}", f"--location={region}"]

    def submit(self, name: str, config_path: str) -> int:
        status = self.runner.run(["gcloud", "batch", "jobs", "submit", name, *self.where,
                                  f"--config={config_path}"])
        self.runner.note(f"logs of {name}: https://console.cloud.google.com/batch/jobsDetail/"
                         f"regions/{self.region}/jobs/{name}/logs?project={self.project}")
        return status

    def state_query(self, name: str) -> list[str]:
        return ["gcloud", "batch", "jobs", "describe", name, *self.where,
                "--format=value(status.state)"]

    def tasks_query(self, name: str) -> list[str]:
        return ["gcloud", "batch", "tasks", "list", f"--job={name}", *self.where, "--format=json"]

    def uid_query(self, name: str) -> list[str]:
        return ["gcloud", "batch", "jobs", "describe", name, *self.where, "--format=value(uid)"]

    def logs_query(self, uid: str, after: str | None) -> list[str]:
        """The job's task logs in Cloud Logging (what its runnables print), oldest first."""
        where = (f'logName="projects/{self.project}/logs/batch_task_logs" AND '
                 f'labels.job_uid="{uid}"')
        if after:
            where += f' AND timestamp>"{after}"'
        return ["gcloud", "logging", "read", where, f"--project={self.project}", "--order=asc",
                "--format=json"]

    def wait(self, name: str) -> str:
        """Polls the job's state until it ends, printing its new log lines as they come."""
        last, uid, after = None, None, None
        while True:
            state = self.runner.output(self.state_query(name), echo=False)
            if state != last:
                self.runner.note(f"job {name}: {state}")
                last = state
            uid = uid or self.runner.output(self.uid_query(name))
            if uid:
                after = self._print_logs(uid, after)
            if state in _DONE_STATES:
                return state
            time.sleep(FLAGS.poll_seconds)

    def _print_logs(self, uid: str, after: str | None) -> str | None:
        """Prints the entries newer than AFTER; returns the newest timestamp printed."""
        found = self.runner.output(self.logs_query(uid, after), show_errors=False, echo=False)
        for entry in json.loads(found) if found else []:
            task = entry.get("labels", {}).get("task_id", "").rsplit("-", 1)[-1].split("/")[0]
            text = entry.get("textPayload", "").rstrip("\n")
            print(f"[task {task}] {text}" if task else text, flush=True)
            after = entry.get("timestamp", after)
        return after

    def preempted(self, name: str) -> bool:
        listing = self.runner.output(self.tasks_query(name))
        if not listing:
            return False
        resumable = (PREEMPTED_EXIT_CODE, launchlib.RUN_STOPPED_TO_RESUME)
        return any(event.get("taskExecution", {}).get("exitCode") in resumable
                   for task in json.loads(listing)
                   for event in task.get("status", {}).get("statusEvents", []))


def launch(overrides: list[str]) -> int:
    region = launchlib.require(FLAGS.region, "region", "REGION (e.g. us-central1)")
    bucket = launchlib.check_workdir(FLAGS.workdir, FLAGS.allow_local_workdir)
    command = launchlib.main_command(FLAGS.config, FLAGS.workdir, overrides)
    name = launchlib.check_name(FLAGS.name)
    env = launchlib.check_env(FLAGS.env)
    clash = sorted(set(env) & set(DISTRIBUTED_ENV))
    if clash:
        raise LaunchError(f"--env sets {', '.join(clash)}: the launcher sets it for each task")
    gpus = accelerators(FLAGS.machine_type, FLAGS.accelerator_type, FLAGS.accelerator_count)
    if FLAGS.num_nodes < 1:
        raise LaunchError(f"--num_nodes={FLAGS.num_nodes}: expected 1 or more")
    if FLAGS.retries < 0:
        raise LaunchError(f"--retries={FLAGS.retries}: expected 0 or more")
    if FLAGS.retries and not FLAGS.wait:
        raise LaunchError("--retries needs --wait: the launcher resubmits when the job fails")
    duration_seconds(FLAGS.max_run_duration)
    retry_names = [name] + [f"{name}-r{i}" for i in range(1, FLAGS.retries + 1)]
    launchlib.check_name(retry_names[-1])
    ship_code = FLAGS.image is None and FLAGS.source == "local"
    if FLAGS.image is None:
        launchlib.check_source(FLAGS.source, FLAGS.git_url)
    elif FLAGS.git_url:
        raise LaunchError("--git_url with --image: the container brings its own code, so "
                          "drop one of them")
    if ship_code and bucket is None:
        raise LaunchError("missing bucket: --source=local stages the code in the workdir's "
                          "bucket, so --workdir must be gs://BUCKET/PATH")

    launchlib.check_config(FLAGS.config, FLAGS.workdir, overrides)
    if ship_code:
        launchlib.check_config_in_source(FLAGS.source, FLAGS.ref, FLAGS.config)
    runner = Runner(FLAGS.dry_run, FLAGS.poll_seconds)
    project = launchlib.resolve_project(FLAGS.project, runner)
    if runner.dry_run:
        runner.note("dry run: these commands would run, in this order; none is run")
    staging = None
    if ship_code:
        tarball = launchlib.archive_source(runner, FLAGS.ref)
        staging = f"gs://{bucket}/bertjax-launch/{name}"
        if runner.run(["gcloud", "storage", "cp", str(tarball),
                       f"{staging}/{launchlib.ARCHIVE_NAME}", f"--project={project}"]) != 0:
            raise LaunchError(f"could not copy the code to {staging}: check the bucket exists "
                              "and you can write to it")

    config = job_config(command, env, gpus, staging)
    config_path = runner.tmpdir / "job.json"
    tmp_path = config_path.with_suffix(".tmp")
    tmp_path.write_text(json.dumps(config, indent=2) + "\n")
    tmp_path.replace(config_path)
    runner.note(f"job config, written to {config_path}:\n{config_path.read_text()}")

    job = BatchJob(runner, project, region)
    if runner.dry_run:
        job.submit(name, str(config_path))
        _note_dry_run_wait(job, name, retry_names[1:])
        return 0
    for tries, attempt_name in enumerate(retry_names):
        if job.submit(attempt_name, str(config_path)) != 0:
            return 1
        if not FLAGS.wait:
            return 0
        if job.wait(attempt_name) == "SUCCEEDED":
            return 0
        if tries == FLAGS.retries or not job.preempted(attempt_name):
            return 1
        runner.note(f"{attempt_name} lost a VM to preemption: retry {tries + 1} of "
                    f"{FLAGS.retries}; training resumes from the checkpoints in {FLAGS.workdir}")
    return 1


def _note_dry_run_wait(job: BatchJob, name: str, retry_names: list[str]) -> None:
    if not FLAGS.wait:
        return
    job.runner.output(job.state_query(name))
    job.runner.output(job.uid_query(name))
    job.runner.output(job.logs_query("UID", None))
    job.runner.note(f"(repeated every {FLAGS.poll_seconds:g} s until the state is one of "
                    f"{', '.join(sorted(_DONE_STATES))}, printing the log lines newer than the "
                    "last one printed)")
    if not retry_names:
        job.runner.note("--retries=0: a preempted job is not resubmitted")
        return
    job.runner.note(
        f"if it FAILED: {shlex.join(job.tasks_query(name))}\n"
        f"and when a task's exit code is {PREEMPTED_EXIT_CODE} (its VM was preempted): submit the "
        f"same job config again as {', '.join(retry_names)} in turn, with the same --workdir, so "
        "training resumes from its last checkpoint there")


def main(argv: list[str]) -> int:
    try:
        return launch(argv[1:])
    except LaunchError as error:
        launchlib.fail(str(error))


if __name__ == "__main__":
    app.run(main)
