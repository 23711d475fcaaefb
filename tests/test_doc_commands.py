"""Every command in README.md, WORKSPACE.md, launch/README.md and docs/*.md works as pasted,
and every link between them resolves.

The commands are read from the documents themselves: each line of a fenced code block (with
`\\` continuations joined) and each inline `code` span that starts like a command. Every one
must fall into a kind this file checks, so a new kind of command cannot go unchecked:

- the README's demo block runs in bash exactly as written (activation included), shrunk to a
  few steps and a small vocabulary;
- other `python -m bertjax.*` commands are parsed by the real flag parsers (bertjax.main's
  config flags, with placeholders such as DIR and SHARDS filled in);
- launcher examples run as `--dry_run`, which also parses their config and overrides;
- `pip install` / `uv pip install` lines resolve to a set of wheels for the machine they are
  for (this one; a TPU VM's Ubuntu for `jax[tpu]`), against the real package index;
- `make` targets exist, and the scripts and test files that commands name exist (and a
  benchmark, `python -m benchmarks.NAME`, defines the flags it is given);
- environment steps that cannot run here (`git clone`, the uv installer, making a venv) and
  synopses (`<...>`, `[...]`, `...`) are listed and skipped.

A relative link must name a file in the repository, and its `#anchor` a heading of that file:
results move between documents, and a README row must still reach its details.
"""
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness
from config_commands import parse
from test_platforms import SOURCE_ONLY
from bertjax import main as bertjax_main

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "WORKSPACE.md", "launch/README.md",
        *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
COMMAND_START = ("python", ".venv/bin/python", "PYTHONPATH=", "make ", "pip ", "uv ",
                 "git clone", "curl ", ". ", "time ")
# Steps that set up a machine: they need the network or a fresh directory, not this checkout.
SETUP_START = ("git clone", "curl -LsSf https://astral.sh/uv/install.sh", "python3.11 -m venv",
               "uv venv",
               "pip install torch --index-url")  # PyTorch's own index: not reachable from here
UV = Path(sys.executable).with_name("uv")


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every command line and inline command span."""
    found = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for block in _code_blocks(text):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip().startswith(COMMAND_START):
                    found.append((doc, " ".join(line.split())))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        # A span may wrap over lines of a paragraph: join them, not the paragraphs.
        prose = re.sub(r"(?<!\n)\n(?!\n)", " ", prose)
        for span in re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            if span.startswith(COMMAND_START) and " " in span:
                found.append((doc, span))
    return found


def kind(command: str) -> str:
    if command.startswith(SETUP_START) or command == ". .venv/bin/activate":
        return "setup"
    if re.search(r"<[^>]*>|\[[^\]]* [^\]]*\]|\.\.\.|\|", command):
        return "synopsis"
    if re.fullmatch(r"python -m bertjax\.\w+", command):
        return "synopsis"  # the name of a CLI in prose, not a command
    if command.startswith("make "):
        return "make"
    if re.match(r"(uv )?pip install ", command):
        return "install"
    if command.startswith("python launch/"):
        return "launcher"
    if re.match(r"(time )?python -m bertjax\.", command):
        return "bertjax"
    if command.startswith("python -c "):
        return "python"
    if re.match(r"(PYTHONPATH=\S+ )?(nice -n \d+ )?(\.venv/bin/)?python ", command):
        return "path"
    return "unknown"


COMMANDS = documented_commands()


def test_every_documented_command_is_of_a_checked_kind():
    assert len(COMMANDS) > 20, COMMANDS
    assert {"docs/results.md", "docs/performance.md", "docs/tpu.md"} <= set(DOCS), DOCS
    unknown = [c for c in COMMANDS if kind(c[1]) == "unknown"]
    assert not unknown, f"commands this test does not know how to check: {unknown}"


# --- Links ----------------------------------------------------------------------------------

def _anchors(text: str) -> set[str]:
    """GitHub's anchors for a document's headings: lower case, punctuation dropped, - for spaces."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    headings = re.findall(r"^#+ +(.+?) *$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_between_documents_resolve():
    broken = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            file = (REPO / doc).parent / path if path else REPO / doc
            inside = file.resolve().is_relative_to(REPO)
            if not (inside and file.exists()):
                broken.append(f"{doc}: {target}: no such file in the repository")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{doc}: {target}: no heading #{anchor} in {path or doc}")
    assert not broken, "\n".join(broken)


# --- bertjax.main and the other CLIs -------------------------------------------------------

def _fill_placeholders(command: str, tmp_path: Path) -> str:
    for placeholder in ("CKPT", "SHARDS", "HF_DIR", "DIR"):
        command = re.sub(rf"=\b{placeholder}\b", f"={tmp_path / placeholder.lower()}", command)
    return command


CLI_COMMANDS = [c for c in COMMANDS if kind(c[1]) == "bertjax"]


@pytest.mark.parametrize("doc, command", CLI_COMMANDS, ids=[c[:60] for _, c in CLI_COMMANDS])
def test_bertjax_commands_parse_with_the_real_flag_parsers(doc, command, tmp_path, monkeypatch):
    argv = shlex.split(_fill_placeholders(command, tmp_path))
    argv = argv[1:] if argv[0] == "time" else argv
    module = argv[2]
    monkeypatch.chdir(REPO)
    if module == "bertjax.main":
        config_args = [a for a in argv[3:] if a.startswith("--config=")]
        assert config_args, f"{doc}: {command}: no --config"
        config = parse(config_args)[0]
        assert bertjax_main._unknown_override(["main", *argv[3:]], config) is None, command
        config, workdir = parse(argv[3:])
        plan = any(a.startswith("--compile_only=") for a in argv)
        assert workdir or plan, f"{doc}: {command}: no --workdir"
        return
    # The other CLIs define their flags at import: parse in a fresh process each.
    code = ("import importlib, sys\nfrom absl import flags\n"
            "module = importlib.import_module(sys.argv[1])\n"
            "rest = flags.FLAGS([sys.argv[1], *sys.argv[2:]])\n"
            "tasks = module.commands() if hasattr(module, 'commands') else None\n"
            "assert (rest[1:2] and rest[1] in tasks) if tasks else rest == [sys.argv[1]], rest\n")
    target = "bertjax.convert.__main__" if module == "bertjax.convert" else module
    result = subprocess.run([sys.executable, "-c", code, target, *argv[3:]], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{doc}: {command}\n{result.stderr[-2000:]}"


DEMO_SHRINK = {
    "bertjax.prepare": ["--vocab_size=1000", "--spm_sample_sentences=5000", "--quiet"],
    "bertjax.main": ["--config.train.num_steps=2", "--config.train.global_batch_size=8",
                     "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10",
                     "--config.train.log_every=1", "--config.train.evaluate=false",
                     "--config.train.checkpoint_every=2", "--config.optimizer.warmup_steps=1",
                     "--config.quiet=true"],
}


def test_the_readme_demo_runs_as_pasted(tmp_path):
    (block,) = [b for b in _code_blocks((REPO / "README.md").read_text())
                if b.startswith(". .venv/bin/activate")]
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.replace("/tmp/bertjax-demo", str(tmp_path))
        for module, extra in DEMO_SHRINK.items():
            if line.startswith(f"python -m {module} "):
                line += " " + " ".join(extra)
        lines.append(line)
    result = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=REPO, timeout=600,
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    # Three texts, each with its blank filled by the model just trained.
    assert result.stdout.count("[MASK]") >= 3, result.stdout
    assert (tmp_path / "run" / "model" / "config.json").exists()


# --- Launchers ------------------------------------------------------------------------------

LAUNCHES = [c for c in COMMANDS if kind(c[1]) == "launcher"]


@pytest.mark.parametrize("doc, command", LAUNCHES, ids=[c[:60] for _, c in LAUNCHES])
def test_launcher_examples_run_as_dry_runs(doc, command, tmp_path):
    for placeholder, value in (("NAME", "bert1"), ("ZONE", "us-central2-b"),
                               ("PROJECT", "my-project")):
        command = re.sub(rf"=\b{placeholder}\b", f"={value}", command)
    argv = shlex.split(command)
    split = argv.index("--") if "--" in argv else len(argv)
    # The TPU plan compiles the example's model for its slice (minutes for BERT-base) and reads
    # its bucket's tokenizer: tests/test_launch.py runs it on a tiny model.
    skip_plan = ["--skip_plan"] if argv[1] == "launch/tpu_vm.py" else []
    result = subprocess.run([sys.executable, *argv[1:split], "--dry_run", *skip_plan,
                             *argv[split:]],
                            cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, f"{doc}: {command}\n{result.stderr[-2000:]}"
    assert "gcloud" in result.stdout


# --- Install recipes ------------------------------------------------------------------------

def _runtime_requirements() -> list[str]:
    import configparser
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


INSTALLS = [c for c in COMMANDS if kind(c[1]) == "install"]


@pytest.mark.parametrize("doc, command", INSTALLS, ids=[c for _, c in INSTALLS])
def test_install_commands_resolve_to_wheels(doc, command, tmp_path):
    argv = shlex.split(command)
    argv = argv[argv.index("install") + 1:]
    assert argv[argv.index("-e") + 1] == ".", command
    del argv[argv.index("-e"):argv.index("-e") + 2]
    # libtpu's wheels need a newer glibc than this machine's: resolve for a TPU VM's Ubuntu.
    platform = "x86_64-manylinux_2_35" if "jax[tpu]" in argv else "x86_64-manylinux_2_28"
    result = subprocess.run(
        [str(UV), "pip", "install", "--dry-run", "--target", str(tmp_path / "target"),
         "--python", sys.executable, "--python-platform", platform, "--python-version", "3.11",
         "--only-binary", ":all:", *[f"--no-binary={p}" for p in SOURCE_ONLY], *argv,
         *_runtime_requirements()],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "UV_NO_PROGRESS": "1"})
    assert result.returncode == 0, f"{doc}: {command}\n{result.stderr[-3000:]}"
    if "jax[tpu]" in argv:
        assert " + libtpu==" in result.stderr
    if "jax[cuda12]" in argv:
        assert " + jax-cuda12-plugin==" in result.stderr


# --- Everything else ------------------------------------------------------------------------

def _benchmark_flags(script: Path) -> set[str]:
    """The flags a benchmark script defines: its own, read from its source, and the
    harness's it takes."""
    source = script.read_text() if script.exists() else ""
    shared = inspect.getsource(harness.parser)
    if "harness.step_flags(" in source:
        shared += inspect.getsource(harness.step_flags)
    return set(re.findall(r'add_argument\(\s*"(--\w+)"', source + shared)) | {"--help"}


def test_make_targets_python_checks_and_named_files_exist():
    for doc, command in COMMANDS:
        argv = shlex.split(command, comments=True)
        if kind(command) == "make":
            dry = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True,
                                 text=True)
            assert dry.returncode == 0, f"{doc}: {command}: {dry.stderr}"
        elif kind(command) == "path":
            argv = argv[1:] if argv[0].startswith("PYTHONPATH=") else argv
            argv = argv[3:] if argv[0] == "nice" else argv
            if argv[1:3] == ["-m", "pytest"]:
                target = argv[-1]
            elif argv[1] == "-m":  # python -m benchmarks.NAME: its flags must be its own
                target = argv[2].replace(".", "/") + ".py"
                given = {a.split("=", 1)[0] for a in argv[3:] if a.startswith("--")}
                unknown = given - _benchmark_flags(REPO / target)
                assert not unknown, f"{doc}: {command}: {target} has no {', '.join(unknown)}"
            else:
                target = argv[1]
            assert (REPO / target).exists(), f"{doc}: {command}: no {target}"
        elif kind(command) == "python":
            result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                                    env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
            assert result.returncode == 0, f"{doc}: {command}: {result.stderr[-1000:]}"
