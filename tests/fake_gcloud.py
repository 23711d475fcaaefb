"""Stands in for `gcloud` in the launcher tests: records each call and plays a scenario.

TPU slices are simulated on this machine: each worker is a directory ($FAKE_GCLOUD_DIR/
workers/N) used as its $HOME, and `tpu-vm ssh --command=...` runs the command there with bash,
as the real ssh would on each worker. The install step is recognised and replaced by a fake
virtualenv whose `python` plays bertjax.main (tests/fake_trainer.sh); the launcher's start,
poll and stop commands run for real. Scenarios ($FAKE_GCLOUD_SCENARIO):

  ok          every worker trains and exits 0
  dropped     the launcher's start command runs but its connection drops (exit 255), and so
              do its first two polls: the run must go on, started once
  preempt     at the first poll of the first slice the workers die and the TPU is PREEMPTED
  fail        worker 1 exits 3; the others would hang (as in a collective) until stopped
  crash       (Batch) the job fails with an ordinary exit code

A queued resource (`queued-resources create|describe|delete`) is the same slice, ACTIVE at
once.

Batch jobs: `describe` answers FAILED for a job whose name does not end in -r1 (in the
preempt and crash scenarios), `tasks list` reports exit code 50001 (preempted) or 1.
"""
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(os.environ["FAKE_GCLOUD_DIR"])
SCENARIO = os.environ["FAKE_GCLOUD_SCENARIO"]
WORKERS = int(os.environ.get("FAKE_GCLOUD_WORKERS", "2"))
TRAINER = Path(__file__).with_name("fake_trainer.sh")
STATE = HERE / "state"


def count(name: str) -> int:
    """Increments and returns the counter NAME (calls of a kind so far, this one included)."""
    path = HERE / f"count-{name}"
    value = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(value))
    return value


def worker_home(index: int) -> Path:
    return HERE / "workers" / str(index)


def install(home: Path) -> None:
    """What the launcher's install step leaves on a worker, with a fake trainer as python."""
    (home / "bertjax").mkdir(parents=True, exist_ok=True)
    venv_bin = home / "bertjax-venv" / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    python = venv_bin / "python"
    python.write_text(f'#!/bin/bash\nexec bash {TRAINER} "$@"\n')
    python.chmod(0o755)


def fake_bin() -> Path:
    """`curl` answering the metadata server's agent-worker-number, as on a TPU VM. Written
    once, by rename: a run started on worker 0 may be running it while the same ssh call
    starts worker 1, and a half-rewritten script answers nothing (the worker then had no
    number, its status line did not parse, and its log went to `worker-.log`)."""
    directory = HERE / "bin"
    curl = directory / "curl"
    if not curl.exists():
        directory.mkdir(exist_ok=True)
        partial = directory / f"curl.{os.getpid()}"
        partial.write_text('#!/bin/bash\necho "$FAKE_WORKER_ID"\n')
        partial.chmod(0o755)
        os.replace(partial, curl)
    return directory


def kill_workers() -> None:
    """What losing the VMs does to the runs on them: every process of each run's session
    dies at once (the launcher started each run as the leader of its own process group)."""
    for index in range(WORKERS):
        pid_file = worker_home(index) / "bertjax-run" / "pid"
        if pid_file.exists():
            try:
                os.killpg(os.getpgid(int(pid_file.read_text())), signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_until_running(worker: str) -> None:
    """Returns once the detached runs have recorded their pids, as they have on real VMs
    long before the launcher's first poll; on a loaded machine a poll could otherwise come
    first, and a played preemption would miss a run that then outlives its slice."""
    deadline = time.monotonic() + 60
    for index in (range(WORKERS) if worker == "all" else [int(worker)]):
        pid_file = worker_home(index) / "bertjax-run" / "pid"
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise SystemExit(f"fake gcloud: worker {index}'s run never wrote {pid_file}")
            time.sleep(0.02)


def ssh(argv: list[str]) -> int:
    command = next(a.split("=", 1)[1] for a in argv if a.startswith("--command="))
    worker = next(a.split("=", 1)[1] for a in argv if a.startswith("--worker="))
    if "uv pip install" in command:
        for index in range(WORKERS):
            install(worker_home(index))
        return 0
    polling = "bertjax-status" in command or "tail -n +" in command
    if SCENARIO == "dropped" and polling and count("dropped-polls") <= 2:
        return 255
    if SCENARIO == "preempt" and "bertjax-status" in command and count("status") == 1:
        kill_workers()
        STATE.write_text("PREEMPTED")
        return 255
    status = 0
    for index in (range(WORKERS) if worker == "all" else [int(worker)]):
        home = worker_home(index)
        env = {**os.environ, "HOME": str(home), "FAKE_WORKER_ID": str(index),
               "PATH": f"{fake_bin()}:{os.environ['PATH']}"}
        result = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
        sys.stdout.write(result.stdout)
        status = status or result.returncode
    if "setsid" in command:
        wait_until_running(worker)
    if SCENARIO == "dropped" and "setsid" in command and count("dropped-starts") == 1:
        return 255
    return status


def main(argv: list[str]) -> int:
    with open(HERE / "calls.jsonl", "a") as log:
        log.write(json.dumps(argv) + "\n")
    if argv[:3] == ["config", "get-value", "project"]:
        print("proj-from-config")
    elif argv[:3] == ["compute", "tpus", "tpu-vm"] and argv[3] == "ssh":
        return ssh(argv)
    elif argv[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
        with tarfile.open(argv[4]) as shipped:
            (HERE / "shipped.txt").write_text("\n".join(shipped.getnames()))
    elif argv[:2] == ["compute", "tpus"] and argv[3] == "create":
        STATE.write_text("READY")
        for index in range(WORKERS):
            worker_home(index).mkdir(parents=True, exist_ok=True)
    elif argv[:2] == ["compute", "tpus"] and argv[3] == "delete":
        kill_workers()
        STATE.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(HERE / "workers")], check=True)
    elif argv[:4] == ["compute", "tpus", "queued-resources", "describe"]:
        if not STATE.exists():
            print("ERROR: NOT_FOUND", file=sys.stderr)
            return 1
        print({"READY": "ACTIVE", "PREEMPTED": "SUSPENDED"}[STATE.read_text()])
    elif argv[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
        if not STATE.exists():
            print("ERROR: NOT_FOUND", file=sys.stderr)
            return 1
        if "--format=json" in argv:
            print(json.dumps({"state": STATE.read_text(),
                              "networkEndpoints": [{"ipAddress": f"10.0.0.{i}"}
                                                   for i in range(WORKERS)]}))
        else:
            print(STATE.read_text())
    elif argv[:3] == ["batch", "jobs", "describe"]:
        if "--format=value(uid)" in argv:
            print(f"uid-{argv[3]}")
        else:
            failed = SCENARIO in ("preempt", "crash") and not argv[3].endswith("-r1")
            print("FAILED" if failed else "SUCCEEDED")
    elif argv[:3] == ["batch", "tasks", "list"]:
        code = 50001 if SCENARIO == "preempt" else 1
        print(json.dumps([{"status": {"statusEvents": [{"taskExecution": {"exitCode": code}}]}}]))
    elif argv[:2] == ["logging", "read"]:
        job_uid = argv[2].split('labels.job_uid="', 1)[1].split('"', 1)[0]
        if "timestamp>" not in argv[2]:
            print(json.dumps([{"timestamp": "2026-01-01T00:00:01Z",
                               "textPayload": f"step 1 of {job_uid}"}]))
        else:
            print("[]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
