"""The TPU VM and Cloud Batch launchers: the commands they print or run, and their errors.

Dry runs are parsed as the shell would parse them (shlex), so a quoting slip shows up as a
wrong argv. Real runs go against a fake `gcloud` on PATH (tests/fake_gcloud.py) that runs the
launcher's remote commands in per-worker directories on this machine and plays a dropped
connection, a preemption and a failing worker, so the detached run, the polling and the retry
logic are checked without any network.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TPU = "tpu_vm.py"
BATCH = "gcp_batch.py"
SHARDS = "--config.data.shard_dir=gs://b/corpus"
# Existing keys whose values a shell would mangle if the launchers quoted them wrongly.
TRICKY = ["--config.optimizer.learning_rate=2e-4", "--config.data.shard_dir=gs://b/two words",
          "--config.data.eval_shard_dir=gs://b/it's \"quoted\"",
          "--config.init_checkpoint=*;$HOME && `id`"]
MAIN = ["python", "-m", "bertjax.main", "--config=configs/base.py", "--workdir=gs://b/run"]
# --skip_plan: the TPU plan compiles BERT-base for the slice, minutes on a CPU; the tests of
# the plan step pass a tiny model instead.
TPU_ARGS = ["--project=proj", "--zone=us-central2-b", "--accelerator_type=v4-32",
            "--config=configs/base.py", "--workdir=gs://b/run", "--name=bert1", "--skip_plan"]
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


def started_argv(start_line):
    """The bertjax.main argv inside the TPU start command (a script run by `bash -c`)."""
    tokens = shlex.split(start_line)
    script = tokens[tokens.index("-c") + 1]
    run = script.split("( cd ", 1)[1].split(" ) > ", 1)[0]
    return after_last_and(run)[1:]  # after `exec`


def tpu_steps(cmds):
    return [c[:5] if c[0] == "gcloud" else c[:1] + c[3:4] for c in cmds]


def test_tpu_dry_run_creates_installs_starts_detached_polls_then_deletes():
    cmds = commands(dry_run(TPU, *TPU_ARGS, "--spot", "--retries=2", "--",
                            "--config.optimizer.learning_rate=2e-4", SHARDS))
    ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    assert tpu_steps(cmds) == [
        ["git", "archive"],
        ["gcloud", "compute", "tpus", "tpu-vm", "describe"],
        ["gcloud", "compute", "tpus", "tpu-vm", "create"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
        ssh, ssh, ssh, ssh,
        ["gcloud", "compute", "tpus", "tpu-vm", "delete"],
    ]
    archive, absent, create, scp, setup, start, status, log, delete = cmds
    assert absent[5] == "bert1"
    tarball = flag(archive, "--output")
    assert archive[-1] == "HEAD" and "--prefix=bertjax/" in archive
    assert create[5] == "bert1" and "--spot" in create
    assert flag(create, "--zone") == "us-central2-b" and flag(create, "--project") == "proj"
    assert flag(create, "--accelerator-type") == "v4-32"
    assert flag(create, "--version") == "tpu-ubuntu2204-base"
    assert scp[5:7] == [tarball, "bert1:bertjax-src.tar.gz"]
    for cmd in (scp, setup, start, status):
        assert flag(cmd, "--worker") == "all" and flag(cmd, "--zone") == "us-central2-b"
        # A slice recreated under the same name has new host keys.
        assert flag(cmd, "--strict-host-key-checking") == "no"
    assert flag(log, "--worker") == "0"
    setup_line = flag(setup, "--command")
    assert "tar -xzf $HOME/bertjax-src.tar.gz" in setup_line
    assert "-c $HOME/bertjax/requirements/constraints.txt -e $HOME/bertjax" in setup_line
    assert "jax[tpu]" in shlex.split(setup_line)
    start_line = flag(start, "--command")
    assert "setsid nohup bash -c" in start_line and "worker.log" in start_line
    assert started_argv(start_line) == [*MAIN, "--config.optimizer.learning_rate=2e-4", SHARDS]
    assert "--quiet" in delete and delete[5] == "bert1"


def test_overrides_reach_bertjax_main_exactly_despite_spaces_and_quotes():
    start = commands(dry_run(TPU, *TPU_ARGS, "--env=XLA_FLAGS=--xla_a=1 --xla_b", "--",
                             *TRICKY))[5]
    start_line = flag(start, "--command")
    assert started_argv(start_line) == [*MAIN, *TRICKY]
    script = shlex.split(start_line)[shlex.split(start_line).index("-c") + 1]
    run = shlex.split(script.split("( cd ", 1)[1].split(" ) > ", 1)[0])
    assert run[:2] == ["$HOME/bertjax", "&&"]
    assert ["export", "XLA_FLAGS=--xla_a=1 --xla_b"] == run[run.index("export"):][:2]


def test_queued_resource_waits_for_capacity_and_is_force_deleted():
    cmds = commands(dry_run(TPU, *TPU_ARGS[:2], "--accelerator_type=v5litepod-16", *TPU_ARGS[3:],
                            "--queued_resource", "--spot", "--source=git",
                            "--git_url=https://example.com/bertjax.git", "--ref=v1.0",
                            "--", SHARDS))
    absent, create, describe, setup, start, status, log, delete = cmds
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
    assert started_argv(flag(start, "--command")) == [*MAIN, SHARDS]
    assert delete[3:6] == ["queued-resources", "delete", "bert1"] and "--force" in delete


def test_reservation_network_service_account_and_internal_ip_reach_gcloud():
    cmds = commands(dry_run(TPU, *TPU_ARGS, "--reserved", "--network=vpc1", "--subnetwork=sub1",
                            "--service_account=sa@proj.iam.gserviceaccount.com", "--internal_ip",
                            "--", SHARDS))
    create = cmds[2]
    assert "--reserved" in create and "--internal-ips" in create
    assert flag(create, "--network") == "vpc1" and flag(create, "--subnetwork") == "sub1"
    assert flag(create, "--service-account") == "sa@proj.iam.gserviceaccount.com"
    for cmd in cmds[3:8]:  # scp and every ssh reach the workers by their internal IPs
        assert "--internal-ip" in cmd, cmd


def test_keep_leaves_the_tpu_and_preemptible_is_passed():
    out = dry_run(TPU, *TPU_ARGS, "--preemptible", "--keep", "--", SHARDS)
    cmds = commands(out)
    assert cmds[2][4] == "create" and "--preemptible" in cmds[2] and "--spot" not in cmds[2]
    assert not any("delete" in c for c in cmds)
    assert "bert1 is left running" in out


def test_dry_run_says_what_a_retry_repeats_and_where_the_logs_go():
    out = dry_run(TPU, *TPU_ARGS, "--spot", "--retries=4", "--", SHARDS)
    notes = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    assert "--retries=4" in notes and "PREEMPTED" in notes
    assert "gcloud compute tpus tpu-vm describe bert1" in notes and "same --workdir" in notes
    assert "gs://b/run/logs/bert1-0/worker-N.log" in notes


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
                  "--max_run_duration=36h", "--", *TRICKY)
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
    assert config["allocationPolicy"]["placement"] == {"collocation": "COLLOCATED"}
    spec = group["taskSpec"]
    assert spec["environment"]["variables"]["BERTJAX_NUM_PROCESSES"] == "4"
    assert spec["maxRunDuration"] == f"{36 * 3600}s" and spec["maxRetryCount"] == 0
    assert spec["volumes"] == [{"gcs": {"remotePath": "b/bertjax-launch/job1"},
                                "mountPath": "/mnt/disks/bertjax-src"}]
    # Install, then wait for every task, then start JAX: jax.distributed.initialize would
    # give up on a task still installing.
    firewall, install, barrier, run = spec["runnables"]
    assert "iptables" in firewall["script"]["text"]
    install = install["script"]["text"].splitlines()
    assert install[0] == "#!/bin/bash"
    assert "tar -xzf /mnt/disks/bertjax-src/bertjax-src.tar.gz -C /opt" in install[3]
    assert "jax[cuda12]" in shlex.split(install[3])
    assert barrier == {"displayName": "all-installed", "barrier": {"name": "installed"}}
    script = run["script"]["text"].splitlines()
    exports = [line for line in script if line.startswith("export BERTJAX_")]
    assert distributed_env(exports, "job1-group0-0", 3) == ["job1-group0-0:8476", "3"]
    assert after_last_and(script[-1]) == [*MAIN, *TRICKY]


def test_batch_network_service_account_and_reservation_reach_the_job():
    out = dry_run(BATCH, *BATCH_ARGS, "--network=projects/proj/global/networks/vpc1",
                  "--subnetwork=projects/proj/regions/us-central1/subnetworks/sub1",
                  "--internal_ip", "--service_account=sa@proj.iam.gserviceaccount.com",
                  "--reservation=gpu-res", "--", SHARDS)
    _, config = batch_config(out)
    allocation = config["allocationPolicy"]
    assert allocation["network"] == {"networkInterfaces": [{
        "network": "projects/proj/global/networks/vpc1",
        "subnetwork": "projects/proj/regions/us-central1/subnetworks/sub1",
        "noExternalIpAddress": True}]}
    assert allocation["serviceAccount"] == {"email": "sa@proj.iam.gserviceaccount.com"}
    assert allocation["instances"][0]["policy"]["reservation"] == "gpu-res"
    # One VM: nothing to wait for, nowhere to be placed near.
    assert "placement" not in allocation
    assert [r["displayName"] for r in config["taskGroups"][0]["taskSpec"]["runnables"]] == [
        "install", "bertjax"]


def test_batch_container_image_path_and_gpu_flags():
    out = dry_run(BATCH, *BATCH_ARGS, "--image=us-docker.pkg.dev/p/r/bertjax:1",
                  "--machine_type=g2-standard-96", "--accelerator_type=nvidia-l4",
                  "--accelerator_count=8", "--coordinator_port=1234", "--",
                  "--config.optimizer.learning_rate=2e-4", SHARDS)
    cmds = commands(out)
    assert [c[:4] for c in cmds] == [["gcloud", "batch", "jobs", "submit"],
                                     ["gcloud", "batch", "jobs", "describe"],
                                     ["gcloud", "batch", "jobs", "describe"],
                                     ["gcloud", "logging", "read", cmds[3][3]]]
    assert 'labels.job_uid="UID"' in cmds[3][3] and "logs/batch_task_logs" in cmds[3][3]
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
    assert after_last_and(line) == [*MAIN, "--config.optimizer.learning_rate=2e-4", SHARDS]


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
    # The config and its overrides, checked by bertjax.main's parser before any TPU exists.
    (TPU, None, ["--", "--config.run_name=x", SHARDS], "has no key 'run_name'"),
    (TPU, None, ["--", "--config.train.num_steps=many", SHARDS], "num_steps=many"),
    (TPU, None, ["--"], "config.data.shard_dir is not set"),
    (TPU, "--config", ["--config=configs/nope.py"], "configs/nope.py"),
    (TPU, "--config", ["--config=configs/tiny.py:nope"], "recipe 'nope': expected one of"),
    # Values bertjax.main's run refuses first (pretrain_config.validate), not only its parser.
    (TPU, None, ["--", "--config.model.dtype=fp16", SHARDS], "model.dtype 'fp16'"),
    (TPU, None, ["--", "--config.train.profile_steps=(5,2)", SHARDS], "profile_steps (5, 2)"),
    (TPU, None, ["--", "--jax_no_such_flag=1", SHARDS], "jax_no_such_flag"),
    (TPU, None, ["--", "stray", SHARDS], "unexpected arguments: stray"),
    (TPU, None, ["--ref=no-such-ref"], "--ref=no-such-ref is not a commit"),
    (BATCH, "--project", [], "missing --project"),
    (BATCH, "--region", [], "missing --region"),
    (BATCH, "--workdir", [], "missing --workdir: pass --workdir=gs://BUCKET/PATH"),
    (BATCH, "--workdir", ["--workdir=gs://"], "missing bucket in --workdir=gs://"),
    (BATCH, "--workdir", ["--workdir=runs/1"], "is not a gs:// path"),
    (BATCH, None, ["--machine_type=n1-standard-8"], "missing --accelerator_type or"),
    (BATCH, None, ["--env=BERTJAX_PROCESS_ID=3"], "the launcher sets it for each task"),
    (BATCH, None, ["--max_run_duration=forever"], "--max_run_duration=forever"),
    (BATCH, None, ["--", "--config.optimizer.lr=1e-3", SHARDS], "optimizer has no key 'lr'"),
    (BATCH, "--config", ["--config=configs/finetune/classify.py", "--"],
     "config.init_checkpoint is not set"),
    (BATCH, "--config", ["--config=configs/finetune/classify.py", "--",
                         "--config.init_checkpoint=gs://b/model"],
     "task.train_file and task.tfds_name are both unset"),
])
def test_bad_input_fails_with_one_clear_line_and_runs_nothing(script, drop, extra, expected):
    base = TPU_ARGS if script == TPU else BATCH_ARGS
    args = [a for a in base if drop is None or not a.startswith(f"{drop}=")]
    overrides = [] if "--" in extra else ["--", SHARDS]
    result = launch(script, "--dry_run", *args, *extra, *overrides)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_jax_flags_after_the_separator_pass_as_bertjax_main_takes_them():
    extra = ["--jax_platforms=tpu", "--jax_default_matmul_precision=highest", "--distributed=on"]
    start = commands(dry_run(TPU, *TPU_ARGS, "--", SHARDS, *extra))[5]
    assert started_argv(flag(start, "--command")) == [*MAIN, SHARDS, *extra]


@pytest.mark.parametrize("script", [TPU, BATCH])
def test_a_config_argument_is_checked_in_the_shipped_commit_and_reaches_the_workers(script):
    base = TPU_ARGS if script == TPU else BATCH_ARGS
    args = [a for a in base if not a.startswith("--config=")]
    phase2 = [SHARDS, "--config.init_checkpoint=gs://b/phase1"]
    out = dry_run(script, *args, "--config=configs/base.py:phase2", "--", *phase2)
    cmds = commands(out)
    assert cmds[0][:4] == ["git", "-C", str(REPO), "archive"]
    main = ["python", "-m", "bertjax.main", "--config=configs/base.py:phase2",
            "--workdir=gs://b/run", *phase2]
    if script == TPU:
        assert started_argv(flag(cmds[5], "--command")) == main
    else:
        script_lines = batch_config(out)[1]["taskGroups"][0]["taskSpec"]["runnables"]
        assert after_last_and(script_lines[-1]["script"]["text"].splitlines()[-1]) == main


def test_every_mode_of_bertjax_main_is_validated_by_the_check():
    code = "import json, launchlib; print(json.dumps(sorted(launchlib.VALIDATORS)))"
    checked = subprocess.run([sys.executable, "-c", code], cwd=REPO / "launch",
                             capture_output=True, text=True, check=True).stdout
    from bertjax import main
    assert json.loads(checked) == sorted(main.MODES)


def test_local_workdir_is_accepted_only_when_asked():
    args = [a for a in TPU_ARGS if not a.startswith("--workdir=")]
    start = commands(dry_run(TPU, *args, "--workdir=/tmp/run", "--allow_local_workdir",
                             "--", SHARDS))[5]
    assert started_argv(flag(start, "--command"))[4] == "--workdir=/tmp/run"


# --- Real runs against tests/fake_gcloud.py ----------------------------------------------

def fake_gcloud_env(tmp_path, scenario):
    fake = tmp_path / "gcloud"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO / "tests" / "fake_gcloud.py"} "$@"\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
            "FAKE_GCLOUD_DIR": str(tmp_path), "FAKE_GCLOUD_SCENARIO": scenario}


def gcloud_calls(tmp_path):
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return [c[:5] if c[3:4] == ["ssh"] else c[:4] for c in calls], calls


def verbs(tmp_path):
    """The TPU verbs called, in order: create, scp, ssh:install, ssh:start, poll, ..."""
    _, calls = gcloud_calls(tmp_path)
    named = []
    for call in calls:
        if call[3:4] != ["ssh"]:
            named.append(call[3] if call[:2] == ["compute", "tpus"] else " ".join(call[:3]))
            continue
        command = flag(call, "--command")
        named.append("ssh:install" if "uv pip install" in command else
                     "ssh:start" if "setsid" in command else
                     "ssh:stop" if "kill -TERM" in command else "poll")
    return named


def tpu_run(tmp_path, scenario, *extra):
    """A real launch on a two-worker fake slice with a local workdir; returns the result and
    the workdir."""
    workdir = tmp_path / "run"
    args = [a for a in TPU_ARGS if not a.startswith("--workdir=")]
    env = fake_gcloud_env(tmp_path, scenario)
    result = launch(TPU, *args, f"--workdir={workdir}", "--allow_local_workdir",
                    "--source=git", "--git_url=https://example.com/bertjax.git",
                    "--poll_seconds=0.2", *extra, "--", *TRICKY, env=env)
    return result, workdir


def test_tpu_run_is_detached_polled_streamed_and_logged_to_the_workdir(tmp_path):
    result, workdir = tpu_run(tmp_path, "ok")
    assert result.returncode == 0, result.stderr
    names = verbs(tmp_path)
    assert names[:5] == ["describe", "create", "ssh:install", "ssh:start", "describe"]
    assert names[5:] and set(names[5:-1]) == {"poll"} and names[-1] == "delete"
    # Worker 0's log lines were streamed, each once, in order.
    assert result.stdout.count("worker 0: step 1") == 1
    assert result.stdout.index("worker 0: step 1") < result.stdout.index("worker 0: step 2, done")
    # Each worker copied its own log into the workdir.
    for worker in (0, 1):
        log = (workdir / "logs" / "bert1-0" / f"worker-{worker}.log").read_text()
        assert f"worker {worker}: step 2, done" in log


def test_a_dropped_connection_changes_nothing_on_the_workers(tmp_path):
    # The start command runs, but its connection drops before the exit code arrives; so do
    # the next two polls. The launcher repeats the start (a no-op now) and keeps polling.
    result, workdir = tpu_run(tmp_path, "dropped", "--retries=3")
    assert result.returncode == 0, result.stderr
    names = verbs(tmp_path)
    assert names.count("create") == 1 and names.count("ssh:start") == 2
    assert "delete" not in names[:-1]
    for worker in (0, 1):
        starts = (tmp_path / f"trainer-starts-{worker}").read_text()
        assert starts.splitlines() == ["started"]
        assert (tmp_path / f"trainer-argv-{worker}").read_text().split("\0")[:-1] == [
            "-m", "bertjax.main", "--config=configs/base.py", f"--workdir={workdir}", *TRICKY]
    assert "the run goes on there" in result.stderr


def test_preempted_tpu_run_is_recreated_and_rerun_on_the_same_workdir(tmp_path):
    result, workdir = tpu_run(tmp_path, "preempt", "--spot", "--retries=2")
    assert result.returncode == 0, result.stderr
    names = verbs(tmp_path)
    attempt = ["create", "ssh:install", "ssh:start"]
    first = names.index("delete")
    assert names[1:4] == attempt and names[first + 1:first + 4] == attempt
    assert names.count("create") == 2 and names[-1] == "delete"
    assert "retry 1 of 2" in result.stderr
    # The second slice ran to the end, logging to the second attempt's folder.
    assert "step 2, done" in (workdir / "logs" / "bert1-1" / "worker-1.log").read_text()


def test_a_run_stopped_after_saving_is_rerun_to_resume(tmp_path):
    """Every worker exits 75, bertjax.main's "saved after a signal": run it again."""
    from bertjax import cli
    code = subprocess.run([sys.executable, "-c", "import launchlib; "
                           "print(launchlib.RUN_STOPPED_TO_RESUME)"], cwd=REPO / "launch",
                          capture_output=True, text=True, check=True).stdout
    assert int(code) == cli.PREEMPTED
    result, workdir = tpu_run(tmp_path, "maintenance", "--retries=1")
    assert result.returncode == 0, result.stderr
    assert "stopped after saving: retry 1 of 1" in result.stderr
    assert "step 2, done" in (workdir / "logs" / "bert1-1" / "worker-0.log").read_text()


def test_a_failing_worker_stops_the_others_and_is_not_retried(tmp_path):
    result, workdir = tpu_run(tmp_path, "fail", "--spot", "--retries=2")
    assert result.returncode == 3, result.stderr
    names = verbs(tmp_path)
    assert names.count("create") == 1 and "ssh:stop" in names and names[-1] == "delete"
    # The failed worker's last lines are shown; the waiting one was told to checkpoint.
    assert "ValueError: worker 1 read a bad shard" in result.stderr
    log0 = (workdir / "logs" / "bert1-0" / "worker-0.log").read_text()
    assert "SIGTERM: checkpoint saved" in log0


def test_ctrl_c_leaves_the_run_going_and_attach_watches_it_to_the_end(tmp_path):
    workdir = tmp_path / "run"
    args = [a for a in TPU_ARGS if not a.startswith("--workdir=")]
    env = {**fake_gcloud_env(tmp_path, "ok"), "FAKE_TRAINER_HOLD": "1"}
    # A terminal's Ctrl-C meets SIGINT at its default; a test run started in the background
    # without job control (`nohup make test &`) would hand the launcher SIGINT ignored.
    launcher = subprocess.Popen(
        [sys.executable, str(REPO / "launch" / TPU), *args, f"--workdir={workdir}",
         "--allow_local_workdir", "--source=git", "--git_url=https://example.com/bertjax.git",
         "--queued_resource", "--internal_ip", "--poll_seconds=0.2", "--", SHARDS],
        cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Ctrl-C once the run is going on both workers (the fake starts them one after the other).
    started = [tmp_path / f"trainer-starts-{worker}" for worker in (0, 1)]
    for _ in range(600):
        if all(s.exists() for s in started) or launcher.poll() is not None:
            break
        time.sleep(0.05)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, stderr
    assert "stopped watching; the run goes on on bert1" in stderr
    assert "delete" not in verbs(tmp_path)

    (tmp_path / "release").touch()  # the training goes on to its end
    # The command the launcher printed, as given: it must find the queued resource and reach
    # the workers by their internal IPs as the first command did.
    (printed,) = [line.split(" with: ", 1)[1] for line in stderr.splitlines()
                  if "Watch it again" in line]
    python, script, *attach_args = shlex.split(printed)
    assert [python, script] == ["python", "launch/tpu_vm.py"]
    calls_before = len(gcloud_calls(tmp_path)[1])
    attached = launch(TPU, *attach_args, "--poll_seconds=0.2", env=env)
    assert attached.returncode == 0, attached.stderr
    assert "worker 0: step 2, done" in attached.stdout
    assert verbs(tmp_path)[-1] == "delete" and verbs(tmp_path).count("ssh:start") == 1
    assert "step 2, done" in (workdir / "logs" / "bert1-0" / "worker-1.log").read_text()
    attach_calls = gcloud_calls(tmp_path)[1][calls_before:]
    assert all("--internal-ip" in c for c in attach_calls if c[3] == "ssh"), attach_calls
    assert attach_calls[-1][2:5] == ["queued-resources", "delete", "bert1"]


def test_a_tpu_name_in_use_is_refused_and_left_alone(tmp_path):
    env = fake_gcloud_env(tmp_path, "ok")
    (tmp_path / "state").write_text("READY")
    result = launch(TPU, *TPU_ARGS, "--", SHARDS, env=env)
    assert result.returncode == 2
    assert "tpu-vm bert1 already exists" in result.stderr.splitlines()[-1]
    assert verbs(tmp_path) == ["describe"]


def test_local_source_ships_the_committed_tree_to_every_worker(tmp_path):
    result = launch(TPU, *TPU_ARGS, "--poll_seconds=0.2", "--", SHARDS,
                    env=fake_gcloud_env(tmp_path, "ok"))
    assert result.returncode == 0, result.stderr
    _, calls = gcloud_calls(tmp_path)
    (scp,) = [c for c in calls if c[3:4] == ["scp"]]
    assert flag(scp, "--worker") == "all"
    shipped = (tmp_path / "shipped.txt").read_text().splitlines()
    assert {"bertjax/configs/base.py", "bertjax/requirements/constraints.txt",
            "bertjax/bertjax/__init__.py"} <= set(shipped)


@pytest.mark.parametrize("dry", [[], ["--dry_run"]])
def test_a_config_missing_from_the_shipped_commit_stops_before_any_tpu(tmp_path, dry):
    # Present here (so it parses), absent from the commit the workers would get; named per
    # process, since xdist may run both parametrizations at once.
    config = REPO / "configs" / f"uncommitted_test_config_{os.getpid()}.py"
    config.write_text((REPO / "configs" / "tiny.py").read_text())
    try:
        args = [a for a in TPU_ARGS if not a.startswith("--config=")]
        result = launch(TPU, *dry, *args, f"--config={config.relative_to(REPO)}:context", "--",
                        SHARDS, env=fake_gcloud_env(tmp_path, "ok"))
    finally:
        config.unlink()
    assert result.returncode == 2 and result.stdout == ""
    assert f"configs/{config.name} is not in HEAD" in result.stderr
    assert not (tmp_path / "calls.jsonl").exists()


def readme_commands(marker):
    """The commands of the launch/README.md code block that holds MARKER, as argv lists."""
    blocks = (REPO / "launch" / "README.md").read_text().split("```")[1::2]
    (block,) = [b for b in blocks if marker in b]
    return [shlex.split(line) for line in block.replace("\\\n", " ").strip().splitlines()]


def tokenizer_dir(path):
    """A shard directory as far as the TPU plan reads one: the tokenizer, whose vocabulary
    size it takes."""
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                               "the", "a"]) + "\n")
    return path


def test_the_readmes_two_phases_run_through_the_launcher_and_the_plan(tmp_path):
    """Phase 1, then phase 2 in the `config:arg` form, launched as launch/README.md writes
    them (committed code shipped, the TPU plan run for phase 2), on configs/tiny.py and its
    second recipe (BERT-base's plan compiles for minutes), a local bucket and a fake slice."""
    tokenizer_dir(tmp_path / "corpus")
    phases = readme_commands("configs/base.py:phase2")
    assert [argv[:2] for argv in phases] == [["python", "launch/tpu_vm.py"]] * 2
    workers_got = []
    for name, argv in zip(["phase1", "phase2"], phases):
        args = [a.replace("gs://my-bucket/", f"{tmp_path}/").replace("configs/base.py",
                                                                     "configs/tiny.py")
                .replace(":phase2", ":context") for a in argv[2:]]
        ours = ["--allow_local_workdir", "--poll_seconds=0.2", f"--name={name}",
                *(["--skip_plan"] if name == "phase1" else [])]
        fake = tmp_path / name
        fake.mkdir()
        result = launch(TPU, *ours, *args, env=fake_gcloud_env(fake, "ok"))
        assert result.returncode == 0, result.stderr
        assert "bertjax/configs/tiny.py" in (fake / "shipped.txt").read_text().splitlines()
        workers_got.append((fake / "trainer-argv-0").read_text().split("\0")[:-1])
        planned = "--compile_only=v4-32" in result.stderr
        assert planned == (name == "phase2")
    shards = f"--config.data.shard_dir={tmp_path}/corpus"
    assert workers_got == [
        ["-m", "bertjax.main", "--config=configs/tiny.py",
         f"--workdir={tmp_path}/base-phase1", shards],
        ["-m", "bertjax.main", "--config=configs/tiny.py:context",
         f"--workdir={tmp_path}/base-phase2", shards,
         f"--config.init_checkpoint={tmp_path}/base-phase1"]]
    # The plan's table is shown before anything is created.
    notes = result.stderr.split("+ gcloud compute tpus tpu-vm create", 1)[0]
    table = notes.split("the TPU plan, run here", 1)[1]
    assert "python -m bertjax.main --config=configs/tiny.py:context --compile_only=v4-32" in table
    assert "v4-32" in table.split("\n", 1)[1] and "mesh" in table


def test_a_run_that_does_not_fit_the_slice_is_refused_before_anything_exists():
    args = [a for a in TPU_ARGS if a != "--skip_plan" and not a.startswith("--config=")]
    # configs/tiny.py with a 30M-piece vocabulary: 43 GiB of parameters and optimizer state per
    # 16 GiB v5e chip. The plan refuses it without compiling the train step, in seconds; a
    # batch too large (activations) is refused the same way, after minutes of compiling.
    result = launch(TPU, "--dry_run", *args, "--accelerator_type=v5litepod-4",
                    "--config=configs/tiny.py", "--", SHARDS,
                    "--config.model.vocab_size=30000000")
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: the TPU plan of --config=configs/tiny.py for "
                               "--accelerator_type=v5litepod-4 failed: ")
    assert "GiB" in lines[0] and "--skip_plan" in lines[0]  # the memory it would need


def test_the_plan_compiles_what_the_workers_run_with_the_config_overrides():
    """The --config.* overrides decide the program; JAX's and bertjax.main's runtime flags are
    for the workers (the plan compiles for the slice wherever it runs)."""
    code = ("import json, sys, tpu_vm; print(json.dumps(tpu_vm.plan_command("
            "'configs/base.py:phase2', 'v5litepod-16', sys.argv[1:])))")
    given = ["--config.model.remat=True", "--jax_platforms=tpu", "--config.train.num_steps",
             "10", "--distributed=on", "--config.data.shard_dir=gs://b/two words"]
    planned = subprocess.run([sys.executable, "-c", code, *given], cwd=REPO / "launch",
                             capture_output=True, text=True, check=True).stdout
    assert json.loads(planned) == [
        sys.executable, "-m", "bertjax.main", "--config=configs/base.py:phase2",
        "--compile_only=v5litepod-16", "--config.model.remat=True", "--config.train.num_steps",
        "10", "--config.data.shard_dir=gs://b/two words"]


@pytest.mark.parametrize("scenario, submitted, returncode", [
    ("preempt", ["job1", "job1-r1"], 0),
    ("crash", ["job1"], 1),
])
def test_batch_job_is_resubmitted_only_after_preemption(tmp_path, scenario, submitted,
                                                        returncode):
    result = launch(BATCH, *BATCH_ARGS, "--image=img", "--retries=1", "--poll_seconds=0.2",
                    "--", SHARDS, env=fake_gcloud_env(tmp_path, scenario))
    assert result.returncode == returncode, result.stderr
    _, calls = gcloud_calls(tmp_path)
    submits = [c for c in calls if c[:3] == ["batch", "jobs", "submit"]]
    assert [c[3] for c in submits] == submitted
    assert len({flag(c, "--config") for c in submits}) == 1
    # The tasks' log lines are streamed from Cloud Logging, once each.
    assert result.stdout.splitlines() == [f"step 1 of uid-{name}" for name in submitted]


def test_config_files_load_without_jax_so_reading_one_is_quick():
    """Reading a config file (pretraining or fine-tuning) must not pull in JAX, Flax or the
    task modules: whatever only reads configs (a launcher's config check up to `validate`,
    which imports what its checks need) would wait seconds for imports it does not use."""
    probe = ("import sys, configs.base, configs.tiny, configs.finetune.classify, "
             "configs.finetune.seq2seq; heavy = sorted({m.split('.')[0] for m in sys.modules} "
             "& {'jax', 'flax', 'optax', 'orbax', 'tensorflow', 'torch'}); print(heavy)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]"
