"""What the TPU VM and Cloud Batch launchers share: checks, commands, worker setup, dry run.

Both launchers turn their flags into a list of commands (gcloud, git) and run them in
order with `Runner`, which in dry-run mode prints each command on one line and runs none.
Lines that are not commands start with `#`, so a dry run reads as an annotated script.
Before any of them, `check_config` parses the config and its overrides with bertjax.main's own
parser and validates the values as bertjax.main does, in a child process of this Python (so the
launchers need bertjax's environment, e.g. `.venv/bin/python launch/tpu_vm.py ...`): a bad key
or value fails here, not on the workers after the machines were paid for.
"""
from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from absl import flags

REPO_ROOT = Path(__file__).resolve().parents[1]
ARCHIVE_NAME = "bertjax-src.tar.gz"
# ssh/scp through gcloud exit with ssh's own 255 when the connection fails (or drops):
# that says nothing about the remote command, so such a step is tried again.
SSH_FAILED = 255
# bertjax.main's exit status when a signal (a TPU maintenance event, a scheduler's SIGTERM)
# stopped it after saving a checkpoint: rerunning the same command resumes (bertjax/cli.py).
RUN_STOPPED_TO_RESUME = 75
SSH_TRIES = 4
# Values a run cannot start without, by config.mode: bertjax.main would find them missing only
# on the workers, after the machines were created and set up.
REQUIRED_VALUES = {"pretrain": ["data.shard_dir"], "finetune": ["init_checkpoint"]}
# The module whose `validate(config)` bertjax.main's run calls first, by config.mode: the check
# calls it too, so a value the run would refuse is refused before any machine exists.
VALIDATORS = {"pretrain": "bertjax.training.pretrain_config",
              "finetune": "bertjax.training.finetune_config"}

# Resource names (TPU VMs, queued resources, Batch jobs) share the RFC 1035 rule.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

flags.DEFINE_string("project", None, "Google Cloud project. Default: `gcloud config get-value "
                    "project` (a dry run needs it given explicitly).")
flags.DEFINE_string("config", None, "Config file for bertjax.main, relative to the repository "
                    "root, e.g. configs/base.py.")
flags.DEFINE_string("workdir", None, "Run directory for bertjax.main: gs://BUCKET/PATH, so "
                    "checkpoints outlive the VMs and a rerun resumes from them.")
flags.DEFINE_bool("allow_local_workdir", False, "Accept a workdir that is not gs:// (its "
                  "checkpoints die with the VM; only for short experiments).")
flags.DEFINE_string("name", None, "Name of the TPU VM / Batch job (lowercase letters, digits, "
                    "hyphens). Default: bertjax-YYYYMMDD-HHMMSS.")
flags.DEFINE_enum("source", "local", ["local", "git"], "Code the workers run: `local` ships "
                  "`git archive` of --ref from this checkout; `git` clones --git_url at --ref.")
flags.DEFINE_string("git_url", None, "Repository to clone on the workers (--source=git).")
flags.DEFINE_string("ref", "HEAD", "Git ref to archive (--source=local; commit first, "
                    "uncommitted changes are not shipped) or to check out (--source=git).")
flags.DEFINE_string("python_version", "3.11", "Python the workers' virtualenv is built with "
                    "(uv fetches it when the image has an older one).")
flags.DEFINE_multi_string("env", [], "KEY=VALUE set for bertjax.main on every worker; "
                          "repeatable (e.g. --env=XLA_FLAGS=...).")
flags.DEFINE_integer("retries", 0, "How many times to start again from scratch (same workdir, "
                     "so training resumes from its last checkpoint) after a preemption.")
flags.DEFINE_bool("dry_run", False, "Print every command, in order, one per line; run none.")
flags.DEFINE_string("network", None, "VPC network of the VMs (default: the project's `default`).")
flags.DEFINE_string("subnetwork", None, "Subnetwork of the VMs, in the zone's region.")
flags.DEFINE_string("service_account", None, "Service account the VMs run as (its email); it "
                    "needs read/write access to the workdir's bucket. Default: the Compute "
                    "Engine default service account.")
flags.DEFINE_bool("internal_ip", False, "The VMs get no external IP address; the launcher "
                  "reaches them by their internal IPs, so run it from inside the same VPC. The "
                  "subnetwork needs Private Google Access (and Cloud NAT to fetch packages).")
flags.DEFINE_float("poll_seconds", 60, "How often the launcher asks how the run is going; "
                   "also the pause before trying a failed ssh/scp again.")

FLAGS = flags.FLAGS


class LaunchError(Exception):
    """A bad or missing launcher input; the message names it and what was expected."""


def fail(message: str) -> None:
    """Prints one error line and exits non-zero: bad input never ends in a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def require(value: str | None, flag: str, expected: str) -> str:
    if not value:
        raise LaunchError(f"missing --{flag}: pass --{flag}={expected}")
    return value


def check_name(name: str | None) -> str:
    name = name or time.strftime("bertjax-%Y%m%d-%H%M%S")
    if not _NAME_RE.fullmatch(name):
        raise LaunchError(f"--name={name!r} is not a valid resource name: use 1-63 lowercase "
                          "letters, digits and hyphens, starting with a letter")
    return name


def check_workdir(workdir: str | None, allow_local: bool) -> str | None:
    """Returns the workdir's bucket, or None for an allowed local workdir."""
    workdir = require(workdir, "workdir", "gs://BUCKET/PATH")
    if workdir.startswith("gs://"):
        bucket = workdir[len("gs://"):].split("/", 1)[0]
        if not bucket:
            raise LaunchError(f"missing bucket in --workdir={workdir}: expected gs://BUCKET/PATH")
        return bucket
    if not allow_local:
        raise LaunchError(
            f"--workdir={workdir} is not a gs:// path: the VMs' disks (and the checkpoints on "
            "them) are lost when the VMs are deleted or preempted. Use gs://BUCKET/PATH, or pass "
            "--allow_local_workdir to accept that")
    return None


def check_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME_RE.fullmatch(key):
            raise LaunchError(f"--env={pair!r} is not KEY=VALUE with KEY a variable name")
        env[key] = value
    return env


def main_command(config: str | None, workdir: str, overrides: Sequence[str]) -> list[str]:
    """The `python -m bertjax.main` argv every worker runs; overrides pass through verbatim."""
    config = require(config, "config", "configs/base.py")
    for arg in overrides:
        if re.match(r"--(config|workdir)(=|$)", arg):
            raise LaunchError(f"{arg!r} after `--`: pass --config and --workdir to the launcher "
                              "itself; only overrides such as --config.x.y=v go after `--`")
    return ["python", "-m", "bertjax.main", f"--config={config}", f"--workdir={workdir}",
            *overrides]


_CHECK_CONFIG = """
import importlib
import sys
import jax
# As bertjax.main's __main__ does before parsing, so JAX's own flags (--jax_platforms=tpu, ...)
# are accepted here exactly when the workers accept them.
jax.config.config_with_absl()
from bertjax import cli, main
rest = main.parse_flags(["bertjax.main", *sys.argv[1:]])
if len(rest) > 1:
    sys.exit(f"bertjax.main: error: unexpected arguments: {' '.join(rest[1:])}")
config = main._CONFIG.value
if config.mode not in main.MODES:
    sys.exit(f"bertjax.main: error: config.mode {config.mode!r}: expected one of "
             f"{', '.join(main.MODES)}")
for key in REQUIRED.get(config.mode, []):
    value = config
    for part in key.split("."):
        value = value[part]
    if not value:
        sys.exit(f"bertjax.main: error: config.{key} is not set: a {config.mode} run needs it "
                 f"(--config.{key}=...)")
with cli.one_line_errors("bertjax.main"):
    importlib.import_module(VALIDATORS[config.mode]).validate(config)
"""


def child_env() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, for the child
    Pythons that run bertjax itself (the config check, the TPU plan)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def error_line(stderr: str, returncode: int) -> str:
    """What a failed bertjax.main child said was wrong: its one `bertjax.main: error:` line
    (or absl's flag error), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if not line.startswith(("bertjax.main: error:", "FATAL Flags parsing error:")):
            continue
        reason = line.split("error:", 1)[1].strip()
        if reason and not reason.endswith(":"):
            return reason
        # A config file that raised: absl names the flag on the next line and prints the
        # file's traceback, whose last exception line says what was wrong.
        raised = [found for found in lines[index + 1:]
                  if re.match(r"[\w.]+(Error|Exception): ", found)]
        return " ".join(filter(None, [reason, *lines[index + 1:index + 2], *raised[-1:]]))
    return lines[-1] if lines else f"exit {returncode}"


def missing_module(stderr: str) -> str | None:
    """The import error line when the child could not import bertjax or its dependencies."""
    lines = [line.strip() for line in stderr.splitlines()
             if "ModuleNotFoundError" in line or "No module named" in line]
    return lines[-1] if lines else None


def check_config(config: str, workdir: str, overrides: Sequence[str]) -> None:
    """Parses CONFIG and OVERRIDES as `python -m bertjax.main` will on the workers, and
    validates the values as its run does first.

    It runs bertjax.main's own flag parser in a child of this Python (bertjax.main defines
    `--config` and `--workdir` too, so it cannot share this process's flags), from the
    repository root, where the workers run it too.
    """
    code = f"REQUIRED = {REQUIRED_VALUES!r}\nVALIDATORS = {VALIDATORS!r}\n{_CHECK_CONFIG}"
    result = subprocess.run(
        [sys.executable, "-c", code, f"--config={config}", f"--workdir={workdir}", *overrides],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False, env=child_env())
    if result.returncode == 0:
        return
    missing = missing_module(result.stderr)
    if missing:
        raise LaunchError(f"cannot check --config={config}: {missing}. The launcher checks it "
                          f"with bertjax's own parser, so run it with bertjax's environment "
                          f"(`make install`, then .venv/bin/python launch/...)")
    raise LaunchError(f"--config={config} with the overrides after `--` would fail on the "
                      f"workers: {error_line(result.stderr, result.returncode)}")


def env_exports(env: dict[str, str]) -> list[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


def check_source(source: str, git_url: str | None) -> None:
    if source == "git":
        require(git_url, "git_url", "https://github.com/OWNER/bertjax.git (with --source=git)")
    elif git_url:
        raise LaunchError("--git_url is only used with --source=git (the default, --source=local, "
                          "ships this checkout)")


def worker_setup(base: str, source: str, git_url: str | None, ref: str, tarball: str,
                 jax_extra: str, python_version: str) -> str:
    """Shell line that puts the repo at BASE/bertjax and a virtualenv at BASE/bertjax-venv.

    BASE is a trusted constant ($HOME or /opt), left unquoted so the worker's shell expands it;
    every user-given value is quoted. uv provides the Python version (TPU images ship 3.10,
    bertjax needs 3.11) and installs against the repo's pinned constraints, so workers run the
    versions the tests ran on, plus the accelerator's jax extra.
    """
    repo, venv, uv_dir = f"{base}/bertjax", f"{base}/bertjax-venv", f"{base}/bertjax-uv"
    steps = [f"rm -rf {repo} {venv}"]
    if source == "git":
        steps += [f"git clone --quiet {shlex.quote(git_url)} {repo}",
                  f"git -C {repo} checkout --quiet {shlex.quote(ref)}"]
    else:
        steps.append(f"tar -xzf {tarball} -C {base}")
    steps += [
        f"curl -LsSf https://astral.sh/uv/install.sh | env UV_INSTALL_DIR={uv_dir} "
        "UV_NO_MODIFY_PATH=1 sh",
        f"{uv_dir}/uv venv --quiet --python {shlex.quote(python_version)} {venv}",
        f"{uv_dir}/uv pip install --quiet --python {venv}/bin/python "
        f"-c {repo}/requirements/constraints.txt -e {repo} {shlex.quote(f'jax[{jax_extra}]')}",
    ]
    return " && ".join(steps)


def worker_run(base: str, env: dict[str, str], command: Sequence[str]) -> list[str]:
    """Steps that start bertjax.main from the repo root (configs/ paths are relative to it)."""
    return [f"cd {base}/bertjax", f". {base}/bertjax-venv/bin/activate", *env_exports(env),
            shlex.join(command)]


class Runner:
    """Runs commands, or in dry-run mode prints them one per line and runs nothing.

    In a real run each command is echoed to stderr (like `bash -x`) before it runs, so the
    log shows what happened; its output streams through unless it is captured.
    """

    def __init__(self, dry_run: bool, pause_seconds: float = 60):
        self.dry_run, self.pause_seconds = dry_run, pause_seconds
        self.tmpdir = Path(tempfile.mkdtemp(prefix="bertjax-launch-"))
        if not dry_run:
            # A dry run keeps its files (job.json can be submitted by hand); a real run has
            # handed them to gcloud by the time it exits.
            atexit.register(shutil.rmtree, self.tmpdir, ignore_errors=True)

    def note(self, message: str) -> None:
        for line in message.splitlines():
            print(f"# {line}".rstrip(), file=sys.stdout if self.dry_run else sys.stderr,
                  flush=True)

    def _echo(self, argv: Sequence[str]) -> None:
        if self.dry_run:
            print(shlex.join(argv), flush=True)
        else:
            print(f"+ {shlex.join(argv)}", file=sys.stderr, flush=True)

    def run(self, argv: Sequence[str]) -> int:
        self._echo(argv)
        if self.dry_run:
            return 0
        return subprocess.run(list(argv), check=False).returncode

    def run_retried(self, argv: Sequence[str], what: str, any_failure: bool = False) -> int:
        """Runs ARGV up to SSH_TRIES times while it fails as ssh fails (exit 255), or in any
        way with ANY_FAILURE (steps that are safe to repeat, like copying a file)."""
        for attempt in range(1, SSH_TRIES + 1):
            status = self.run(argv)
            if status == 0 or attempt == SSH_TRIES or not (any_failure or status == SSH_FAILED):
                return status
            self.note(f"{what} failed (exit {status}); trying again ({attempt + 1} of "
                      f"{SSH_TRIES}) in {self.pause_seconds:g} s")
            time.sleep(self.pause_seconds)
        return status

    def output(self, argv: Sequence[str], show_errors: bool = True,
               timeout: float | None = None, strip: bool = True,
               echo: bool = True) -> str | None:
        """stdout of a query command (None when it fails or times out, or in a dry run).

        ECHO=False keeps a real run's log free of commands repeated every poll."""
        if echo or self.dry_run:
            self._echo(argv)
        if self.dry_run:
            return None
        try:
            result = subprocess.run(list(argv), check=False, capture_output=True, text=True,
                                    timeout=timeout)
        except subprocess.TimeoutExpired:
            if show_errors:
                print(f"(no answer in {timeout:g} s)", file=sys.stderr)
            return None
        if result.returncode != 0:
            if show_errors:
                print(result.stderr, file=sys.stderr, end="")
            return None
        return result.stdout.strip() if strip else result.stdout


def resolve_project(project: str | None, runner: Runner) -> str:
    if project:
        return project
    if runner.dry_run:
        raise LaunchError("missing --project: a dry run does not read gcloud's configuration, "
                          "pass --project=PROJECT")
    found = runner.output(["gcloud", "config", "get-value", "project"])
    if not found or found == "(unset)":
        raise LaunchError("missing --project: pass --project=PROJECT or run "
                          "`gcloud config set project PROJECT`")
    return found


def archive_source(runner: Runner, ref: str) -> Path:
    """`git archive` of REF (a commit: check_config_in_source checked it) into a local
    tarball that unpacks to bertjax/."""
    tarball = runner.tmpdir / ARCHIVE_NAME
    status = runner.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar.gz",
                         "--prefix=bertjax/", f"--output={tarball}", ref])
    if status != 0:
        raise LaunchError(f"`git archive {ref}` failed in {REPO_ROOT}")
    return tarball


def config_file(config: str) -> str:
    """The file of a `--config` value: `configs/base.py:phase2` is configs/base.py with the
    argument `phase2`, as bertjax.main (ml_collections) reads it."""
    return config.split(":", 1)[0]


def check_config_in_source(source: str, ref: str, config: str) -> None:
    """Fails before any VM exists when --ref is not a commit or lacks the config file. Local
    and read-only, so a dry run checks it too."""
    if source != "local":
        return
    found = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "--quiet",
                            f"{ref}^{{commit}}"], capture_output=True, check=False)
    if found.returncode != 0:
        raise LaunchError(f"--ref={ref} is not a commit of {REPO_ROOT}")
    path = config_file(config)
    found = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{ref}:{path}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        raise LaunchError(f"--config={config}: {path} is not in {ref} of {REPO_ROOT}: the "
                          "workers get that commit (commit the file, or fix the path: it is "
                          "relative to the repository root)")
