"""The TPU VM and Cloud Batch launchers: the commands they print or run, and their errors.

Dry runs are parsed as the shell would parse them (shlex), so a quoting slip shows up as a
wrong argv. Real runs go against a fake `gcloud` on PATH that records its argv and plays a
preemption, which checks the retry loop without any network.
"""
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TPU = "tpu_vm.py"
BATCH = "gcp_batch.py"
TRICKY = ["--config.optimizer.learning_rate=2e-4", "--config.run_name=two words",
          "--config.note=it's \"quoted\"", "--config.pattern=*;$HOME && `id`"]
MAIN = ["python", "-m", "bertjax.main", "--config=configs/base.py", "--workdir=gs://b/run"]
TPU_ARGS = ["--project=proj", "--zone=us-central2-b", "--accelerator_type=v4-32",
            "--config=configs/base.py", "--workdir=gs://b/run", "--name=bert1"]
BATCH_ARGS = ["--project=proj", "--region=us-central1", "--config=configs/base.py",
              "--workdir=gs://b/run", "--name=job1"]


@pytest.fixture(autouse=True)
def _launcher_tmpdir(tmp_path, monkeypatch):
    """Dry runs keep their job.json: keep them out of the system temp dir."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def launch(script, *args, env=None):
    return subprocess.run([sys.executable, str(REPO / "launch" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def dry_run(script, *args):
    result = launch(script, "--dry_run", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def commands(stdout):
    return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith("#")]


def flag(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def after_last_and(shell_line):
    """The argv of the last command in `a && b && c`, split as a POSIX shell would."""
    tokens = shlex.split(shell_line)
    return tokens[len(tokens) - tokens[::-1].index("&&"):]


def test_tpu_dry_run_creates_installs_runs_on_all_workers_then_deletes():
    cmds = commands(dry_run(TPU, *TPU_ARGS, "--spot", "--retries=2", "--",
                            "--config.optimizer.learning_rate=2e-4"))
    steps = [c[:5] if c[0] == "gcloud" else c[:1] + c[3:4] for c in cmds]
    assert steps == [
        ["git", "archive"],
        ["gcloud", "compute", "tpus", "tpu-vm", "describe"],
        ["gcloud", "compute", "tpus", "tpu-vm", "create"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
        ["gcloud", "compute", "tpus", "tpu-vm", "delete"],
    ]
    archive, absent, create, scp, setup, run, delete = cmds
    assert absent[5] == "bert1"
    tarball = flag(archive, "--output")
    assert archive[-1] == "HEAD" and "--prefix=bertjax/" in archive
    assert create[5] == "bert1" and "--spot" in create
    assert flag(create, "--zone") == "us-central2-b" and flag(create, "--project") == "proj"
    assert flag(create, "--accelerator-type") == "v4-32"
    assert flag(create, "--version") == "tpu-ubuntu2204-base"
    assert scp[5:7] == [tarball, "bert1:bertjax-src.tar.gz"]
    for cmd in (scp, setup, run):
        assert flag(cmd, "--worker") == "all" and flag(cmd, "--zone") == "us-central2-b"
    setup_line = flag(setup, "--command")
    assert "tar -xzf $HOME/bertjax-src.tar.gz" in setup_line
    assert "-c $HOME/bertjax/requirements/constraints.txt -e $HOME/bertjax" in setup_line
    assert "jax[tpu]" in shlex.split(setup_line)
    assert after_last_and(flag(run, "--command")) == [
        *MAIN, "--config.optimizer.learning_rate=2e-4"]
    assert "--quiet" in delete and delete[5] == "bert1"


def test_overrides_reach_bertjax_main_exactly_despite_spaces_and_quotes():
    run = commands(dry_run(TPU, *TPU_ARGS, "--env=XLA_FLAGS=--xla_a=1 --xla_b", "--", *TRICKY))[-2]
    remote = flag(run, "--command")
    assert after_last_and(remote) == [*MAIN, *TRICKY]
    tokens = shlex.split(remote)
    assert tokens[:3] == ["cd", "$HOME/bertjax", "&&"]
    assert ["export", "XLA_FLAGS=--xla_a=1 --xla_b"] == tokens[tokens.index("export"):][:2]


def test_queued_resource_waits_for_capacity_and_is_force_deleted():
    cmds = commands(dry_run(TPU, *TPU_ARGS[:2], "--accelerator_type=v5litepod-16", *TPU_ARGS[3:],
                            "--queued_resource", "--spot", "--source=git",
                            "--git_url=https://example.com/bertjax.git", "--ref=v1.0"))
    absent, create, describe, setup, run, delete = cmds
    assert absent[3:6] == ["queued-resources", "describe", "bert1"]
    assert create[3:6] == ["queued-resources", "create", "bert1"]
    assert flag(create, "--runtime-version") == "v2-alpha-tpuv5-lite"
    assert flag(create, "--node-id") == "bert1" and "--spot" in create
    assert flag(create, "--accelerator-type") == "v5litepod-16"
    assert describe[3:6] == ["queued-resources", "describe", "bert1"]
    assert flag(describe, "--format") == "value(state.state)"
    assert setup[3:6] == ["tpu-vm", "ssh", "bert1"] and flag(setup, "--worker") == "all"
    setup_tokens = shlex.split(flag(setup, "--command"))
    assert "https://example.com/bertjax.git" in setup_tokens
    assert "checkout" in setup_tokens and "v1.0" in setup_tokens
    assert after_last_and(flag(run, "--command")) == MAIN
    assert delete[3:6] == ["queued-resources", "delete", "bert1"] and "--force" in delete


def test_keep_leaves_the_tpu_and_preemptible_is_passed():
    out = dry_run(TPU, *TPU_ARGS, "--preemptible", "--keep")
    cmds = commands(out)
    assert cmds[2][4] == "create" and "--preemptible" in cmds[2] and "--spot" not in cmds[2]
    assert not any("delete" in c for c in cmds)
    assert "bert1 is left running" in out


def test_dry_run_says_what_a_retry_repeats():
    out = dry_run(TPU, *TPU_ARGS, "--spot", "--retries=4")
    notes = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    assert "--retries=4" in notes and "PREEMPTED" in notes
    assert "gcloud compute tpus tpu-vm describe bert1" in notes and "same --workdir" in notes


def batch_config(stdout):
    submit = [c for c in commands(stdout) if c[:4] == ["gcloud", "batch", "jobs", "submit"]]
    assert len(submit) == 1
    config = json.loads(Path(flag(submit[0], "--config")).read_text())
    lines = stdout.split("# job config, written to")[1].splitlines()[1:]
    printed = [line[2:] for line in lines[:[line[:1] for line in lines].index("g")]]
    assert json.loads("\n".join(printed)) == config
    return submit[0], config


def distributed_env(exports, hostname, index):
    """What the task's shell makes of the launcher's exports, given Batch's variables."""
    script = "\n".join([*exports, 'echo "$BERTJAX_COORDINATOR_ADDRESS $BERTJAX_PROCESS_ID"'])
    env = {**os.environ, "BATCH_MAIN_NODE_HOSTNAME": hostname, "BATCH_NODE_INDEX": str(index)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_batch_job_json_runs_one_jax_process_per_gpu_vm():
    out = dry_run(BATCH, *BATCH_ARGS, "--num_nodes=4", "--spot", "--zones=us-central1-a",
                  "--", *TRICKY)
    cmds = commands(out)
    assert [c[:3] for c in cmds[:2]] == [["git", "-C", str(REPO)], ["gcloud", "storage", "cp"]]
    assert cmds[1][4] == "gs://b/bertjax-launch/job1/bertjax-src.tar.gz"
    submit, config = batch_config(out)
    assert submit[4] == "job1" and flag(submit, "--location") == "us-central1"
    assert flag(submit, "--project") == "proj"
    group = config["taskGroups"][0]
    assert group["taskCount"] == group["parallelism"] == 4 and group["taskCountPerNode"] == 1
    assert group["requireHostsFile"] is True
    instance = config["allocationPolicy"]["instances"][0]
    assert instance["installGpuDrivers"] is True
    assert instance["policy"]["machineType"] == "a3-highgpu-8g"
    assert instance["policy"]["accelerators"] == [{"type": "nvidia-h100-80gb", "count": 8}]
    assert instance["policy"]["provisioningModel"] == "SPOT"
    assert config["allocationPolicy"]["location"] == {"allowedLocations": ["zones/us-central1-a"]}
    spec = group["taskSpec"]
    assert spec["environment"]["variables"]["BERTJAX_NUM_PROCESSES"] == "4"
    assert spec["volumes"] == [{"gcs": {"remotePath": "b/bertjax-launch/job1"},
                                "mountPath": "/mnt/disks/bertjax-src"}]
    script = spec["runnables"][-1]["script"]["text"].splitlines()
    assert script[0] == "#!/bin/bash"
    assert "tar -xzf /mnt/disks/bertjax-src/bertjax-src.tar.gz -C /opt" in script[3]
    assert "jax[cuda12]" in shlex.split(script[3])
    exports = [line for line in script if line.startswith("export BERTJAX_")]
    assert distributed_env(exports, "job1-group0-0", 3) == ["job1-group0-0:8476", "3"]
    assert after_last_and(script[-1]) == [*MAIN, *TRICKY]


def test_batch_container_image_path_and_gpu_flags():
    out = dry_run(BATCH, *BATCH_ARGS, "--image=us-docker.pkg.dev/p/r/bertjax:1",
                  "--machine_type=g2-standard-96", "--accelerator_type=nvidia-l4",
                  "--accelerator_count=8", "--coordinator_port=1234", "--",
                  "--config.optimizer.learning_rate=2e-4")
    cmds = commands(out)
    assert [c[:4] for c in cmds] == [["gcloud", "batch", "jobs", "submit"],
                                     ["gcloud", "batch", "jobs", "describe"]]
    _, config = batch_config(out)
    policy = config["allocationPolicy"]["instances"][0]["policy"]
    assert policy["machineType"] == "g2-standard-96"
    assert policy["accelerators"] == [{"type": "nvidia-l4", "count": 8}]
    assert policy["provisioningModel"] == "STANDARD"
    spec = config["taskGroups"][0]["taskSpec"]
    assert config["taskGroups"][0]["taskCount"] == 1 and "volumes" not in spec
    (runnable,) = spec["runnables"]
    container = runnable["container"]
    assert container["imageUri"] == "us-docker.pkg.dev/p/r/bertjax:1"
    assert container["entrypoint"] == "/bin/bash" and container["commands"][0] == "-c"
    assert "--network=host" in container["options"]
    line = container["commands"][1]
    exports = [part for part in line.split(" && ") if part.startswith("export BERTJAX_")]
    assert distributed_env(exports, "host-a", 0) == ["host-a:1234", "0"]
    assert after_last_and(line) == [*MAIN, "--config.optimizer.learning_rate=2e-4"]


@pytest.mark.parametrize("script, drop, extra, expected", [
    (TPU, "--project", [], "missing --project"),
    (TPU, "--zone", [], "missing --zone"),
    (TPU, "--workdir", [], "missing --workdir: pass --workdir=gs://BUCKET/PATH"),
    (TPU, "--workdir", ["--workdir=gs:///run"], "missing bucket in --workdir=gs:///run"),
    (TPU, "--workdir", ["--workdir=/tmp/run"], "--allow_local_workdir"),
    (TPU, "--accelerator_type", [], "missing --accelerator_type"),
    (TPU, "--accelerator_type", ["--accelerator_type=v9z-8"], "pass --runtime_version"),
    (TPU, "--name", ["--name=Bad_Name"], "--name='Bad_Name' is not a valid resource name"),
    (TPU, None, ["--", "--workdir=gs://other/run"], "pass --config and --workdir to the launcher"),
    (TPU, None, ["--source=git"], "missing --git_url"),
    (BATCH, "--project", [], "missing --project"),
    (BATCH, "--region", [], "missing --region"),
    (BATCH, "--workdir", [], "missing --workdir: pass --workdir=gs://BUCKET/PATH"),
    (BATCH, "--workdir", ["--workdir=gs://"], "missing bucket in --workdir=gs://"),
    (BATCH, "--workdir", ["--workdir=runs/1"], "is not a gs:// path"),
    (BATCH, None, ["--machine_type=n1-standard-8"], "missing --accelerator_type or"),
    (BATCH, None, ["--env=BERTJAX_PROCESS_ID=3"], "the launcher sets it for each task"),
])
def test_bad_input_fails_with_one_clear_line_and_runs_nothing(script, drop, extra, expected):
    base = TPU_ARGS if script == TPU else BATCH_ARGS
    args = [a for a in base if drop is None or not a.startswith(f"{drop}=")]
    result = launch(script, "--dry_run", *args, *extra)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_local_workdir_is_accepted_only_when_asked():
    args = [a for a in TPU_ARGS if not a.startswith("--workdir=")]
    run = commands(dry_run(TPU, *args, "--workdir=/tmp/run", "--allow_local_workdir"))[-2]
    assert after_last_and(flag(run, "--command"))[4] == "--workdir=/tmp/run"


FAKE_GCLOUD = """\
#!{python}
'''Stands in for gcloud: logs argv, plays one preemption, answers state queries.'''
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
here = Path(os.environ["FAKE_GCLOUD_DIR"])
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps(argv) + "\\n")
state = here / "state"
scenario = os.environ["FAKE_GCLOUD_SCENARIO"]
if argv[:3] == ["config", "get-value", "project"]:
    print("proj-from-config")
elif argv[:3] == ["compute", "tpus", "tpu-vm"] and argv[3] == "ssh" and any(
        "bertjax.main" in a for a in argv):
    runs = here / "runs"
    runs.write_text(str(int(runs.read_text()) + 1) if runs.exists() else "1")
    if runs.read_text() == "1" and scenario != "ok":
        state.write_text("PREEMPTED" if scenario == "preempt" else "READY")
        sys.exit(255)
elif argv[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    import tarfile
    with tarfile.open(argv[4]) as shipped:
        (here / "shipped.txt").write_text("\\n".join(shipped.getnames()))
elif argv[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
    if not state.exists():
        sys.exit("ERROR: NOT_FOUND")
    print(state.read_text())
elif argv[:3] == ["batch", "jobs", "describe"]:
    print("SUCCEEDED" if argv[3].endswith("-r1") else "FAILED")
elif argv[:3] == ["batch", "tasks", "list"]:
    print(json.dumps([{{"status": {{"statusEvents": [
        {{"taskExecution": {{"exitCode": 50001 if scenario == "preempt" else 1}}}}]}}}}]))
"""


def fake_gcloud_env(tmp_path, scenario):
    fake = tmp_path / "gcloud"
    fake.write_text(textwrap.dedent(FAKE_GCLOUD).format(python=sys.executable))
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
            "FAKE_GCLOUD_DIR": str(tmp_path), "FAKE_GCLOUD_SCENARIO": scenario}


def gcloud_calls(tmp_path):
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return [c[:5] if c[3:4] == ["ssh"] else c[:4] for c in calls], calls


TPU_GIT = [*TPU_ARGS[1:], "--source=git", "--git_url=https://example.com/bertjax.git", "--spot"]


def test_preempted_tpu_run_is_recreated_and_rerun_on_the_same_workdir(tmp_path):
    result = launch(TPU, *TPU_GIT, "--retries=2", "--", *TRICKY,
                    env=fake_gcloud_env(tmp_path, "preempt"))
    assert result.returncode == 0, result.stderr
    steps, calls = gcloud_calls(tmp_path)
    tpu = ["compute", "tpus", "tpu-vm"]
    attempt = [tpu + ["create"], tpu + ["ssh", "bert1"], tpu + ["ssh", "bert1"]]
    assert steps == [["config", "get-value", "project"], tpu + ["describe"], *attempt,
                     tpu + ["describe"],
                     tpu + ["delete"], *attempt, tpu + ["delete"]]
    runs = [c for c in calls if any("bertjax.main" in a for a in c)]
    assert len(runs) == 2 and runs[0] == runs[1]
    assert after_last_and(flag(runs[1], "--command")) == [*MAIN, *TRICKY]
    assert all(flag(c, "--project") == "proj-from-config" for c in calls[1:])
    assert "retry 1 of 2" in result.stderr


def test_crashed_tpu_run_is_not_retried_and_the_tpu_is_deleted(tmp_path):
    result = launch(TPU, *TPU_GIT, "--retries=2", env=fake_gcloud_env(tmp_path, "crash"))
    assert result.returncode == 255
    steps, _ = gcloud_calls(tmp_path)
    assert [s[3] for s in steps[1:]] == ["describe", "create", "ssh", "ssh", "describe", "delete"]


def test_a_tpu_name_in_use_is_refused_and_left_alone(tmp_path):
    env = fake_gcloud_env(tmp_path, "crash")
    (tmp_path / "state").write_text("READY")
    result = launch(TPU, *TPU_GIT, env=env)
    assert result.returncode == 2
    assert "tpu-vm bert1 already exists" in result.stderr.splitlines()[-1]
    steps, _ = gcloud_calls(tmp_path)
    assert [s[3] for s in steps[1:]] == ["describe"]


def test_local_source_ships_the_committed_tree_to_every_worker(tmp_path):
    # Any committed file will do as --config: bertjax.main itself never runs here.
    args = [a for a in TPU_ARGS if not a.startswith("--config=")]
    result = launch(TPU, *args, "--config=setup.cfg", env=fake_gcloud_env(tmp_path, "ok"))
    assert result.returncode == 0, result.stderr
    steps, calls = gcloud_calls(tmp_path)
    assert [s[3] for s in steps] == ["describe", "create", "scp", "ssh", "ssh", "delete"]
    assert flag(calls[2], "--worker") == "all"
    shipped = (tmp_path / "shipped.txt").read_text().splitlines()
    assert {"bertjax/setup.cfg", "bertjax/requirements/constraints.txt",
            "bertjax/bertjax/__init__.py"} <= set(shipped)


def test_a_config_missing_from_the_shipped_commit_stops_before_any_tpu(tmp_path):
    args = [a for a in TPU_ARGS if not a.startswith("--config=")]
    result = launch(TPU, *args, "--config=configs/no_such.py", env=fake_gcloud_env(tmp_path, "ok"))
    assert result.returncode == 2
    assert "--config=configs/no_such.py is not in HEAD" in result.stderr
    assert not (tmp_path / "calls.jsonl").exists()


@pytest.mark.parametrize("scenario, submitted, returncode", [
    ("preempt", ["job1", "job1-r1"], 0),
    ("crash", ["job1"], 1),
])
def test_batch_job_is_resubmitted_only_after_preemption(tmp_path, scenario, submitted,
                                                        returncode):
    result = launch(BATCH, *BATCH_ARGS, "--image=img", "--retries=1",
                    env=fake_gcloud_env(tmp_path, scenario))
    assert result.returncode == returncode, result.stderr
    _, calls = gcloud_calls(tmp_path)
    submits = [c for c in calls if c[:3] == ["batch", "jobs", "submit"]]
    assert [c[3] for c in submits] == submitted
    assert len({flag(c, "--config") for c in submits}) == 1
