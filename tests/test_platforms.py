"""bertjax installs where the README says it does: a wheel for every package, per platform.

Each check resolves bertjax's runtime requirements (setup.cfg, with its environment markers)
under requirements/constraints.txt against the real package index, for another platform and
Python, accepting wheels only. uv evaluates the markers for the target platform (pip's
--platform evaluates them for the machine it runs on, which would pick tensorflow-cpu for a
Mac). Nothing is downloaded or installed; each check takes seconds.
"""
import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")
# promise (a dependency of tensorflow-datasets) and rouge-score (seq2seq's ROUGE-L) ship only
# pure-Python source archives, which build anywhere; every other package must have a wheel.
SOURCE_ONLY = ["promise", "rouge-score"]


def runtime_requirements() -> list[str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def python_requires() -> str:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return config["options"]["python_requires"].replace(" ", "")


def resolve(tmp_path, platform: str, python: str) -> subprocess.CompletedProcess:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(runtime_requirements()) + "\n")
    return subprocess.run(
        [str(UV), "pip", "install", "--dry-run", "--target", str(tmp_path / "target"),
         "--python", sys.executable, "--python-platform", platform, "--python-version", python,
         "--only-binary", ":all:", *[f"--no-binary={p}" for p in SOURCE_ONLY],
         "-r", str(requirements), "-c", str(REPO / "requirements" / "constraints.txt")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "UV_NO_PROGRESS": "1"})


def installed(result) -> set[str]:
    """Distribution names of a dry run's ` + name==version` lines."""
    return {line.split("+", 1)[1].split("==")[0].strip().replace("_", "-").lower()
            for line in result.stderr.splitlines() if line.startswith(" + ")}


@pytest.mark.parametrize("platform, tensorflow", [
    ("aarch64-apple-darwin", "tensorflow"),        # every current Mac
    ("aarch64-manylinux_2_28", "tensorflow"),      # Graviton, Ampere, Grace, Raspberry Pi 5
    ("x86_64-manylinux_2_28", "tensorflow-cpu"),   # laptops, CI, Colab, TPU VMs
])
def test_every_package_has_a_wheel_for_the_supported_platforms(tmp_path, platform, tensorflow):
    result = resolve(tmp_path, platform, "3.11")
    assert result.returncode == 0, f"no wheel set for {platform}:\n{result.stderr[-3000:]}"
    names = installed(result)
    assert {"jax", "jaxlib", "flax", tensorflow} <= names, sorted(names)
    other = {"tensorflow", "tensorflow-cpu"} - {tensorflow}
    assert not other & names, f"{platform} would get both TensorFlow builds: {sorted(names)}"


def test_python_requires_is_what_the_pins_have_wheels_for(tmp_path):
    resolves = {python: resolve(tmp_path, "x86_64-manylinux_2_28", python).returncode == 0
                for python in ("3.10", "3.11", "3.13", "3.14")}
    assert resolves == {"3.10": False, "3.11": True, "3.13": True, "3.14": False}
    assert python_requires() == ">=3.11,<3.14"


def test_intel_macs_have_no_wheel_set_as_the_readme_says(tmp_path):
    result = resolve(tmp_path, "x86_64-apple-darwin", "3.11")
    assert result.returncode != 0
    assert "Intel Macs" in (REPO / "README.md").read_text()
