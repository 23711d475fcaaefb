"""The golden runs (tests/golden_runs.py) give exactly the committed figures: every logged loss,
gradient norm, learning rate, evaluation metric and predictions file of a pretraining run
(with a resume from a checkpoint) and of one fine-tuning run per task family.

On the machine type the figures were recorded on the comparison is bit for bit. XLA's CPU
code depends on the instruction set, so elsewhere floats are compared to 1e-4 relative, a
correlation to 1e-3 absolute (below), and the predictions files (which print those floats)
are not compared."""
import json
import math

import pytest

import golden_runs


# Metrics that divide by the spread of the predictions. The golden regression model has barely
# trained, so its predictions are nearly constant and their correlation with the labels is near
# 0 and ill-conditioned: on an AMD EPYC (AVX2) every loss and gradient norm matched the Intel
# figures to 2e-7 relative, but the final Pearson was 0.020769 against 0.020587 (9e-3 relative).
CORRELATIONS = ("pearson", "spearman")


def _close(a, b, exact: bool, where: str = "") -> bool:
    if isinstance(a, float) and isinstance(b, float) and not exact:
        if any(name in where for name in CORRELATIONS):
            return math.isclose(a, b, abs_tol=1e-3)
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
    return a == b


def assert_same(found, expected, exact: bool, where: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(found, dict) and sorted(found) == sorted(expected), \
            f"{where}: keys {sorted(found)} != {sorted(expected)}"
        for key in expected:
            assert_same(found[key], expected[key], exact, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected), \
            f"{where}: {len(found)} entries, expected {len(expected)}"
        for i, (f, e) in enumerate(zip(found, expected)):
            assert_same(f, e, exact, f"{where}[{i}]")
    else:
        assert _close(found, expected, exact, where), f"{where}: {found!r} != {expected!r}"


@pytest.fixture(scope="module")
def golden():
    with open(golden_runs.FIGURES) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return str(tmp_path_factory.mktemp("golden"))


def test_pretraining_and_resume_give_the_committed_figures(golden, directory, monkeypatch):
    monkeypatch.chdir(golden_runs.ROOT)
    found = golden_runs.pretraining(directory)
    exact = golden["machine"] == golden_runs.machine()
    assert found["resumed_metrics"] == found["metrics"]  # resuming changes nothing, anywhere
    assert_same(found["metrics"], golden["pretraining"]["metrics"], exact, "pretraining")


@pytest.mark.parametrize("task", list(golden_runs.FINETUNE_RUNS))
def test_finetuning_gives_the_committed_figures(task, golden, directory, monkeypatch):
    from finetune_helpers import tiny_model_dir
    import os
    monkeypatch.chdir(golden_runs.ROOT)
    model_dir = os.path.join(directory, "tiny-model")
    if not os.path.exists(model_dir):
        tiny_model_dir(model_dir)
    found = golden_runs.finetuning(directory, task, model_dir)
    expected = golden["finetuning"][task]
    exact = golden["machine"] == golden_runs.machine()
    if not exact:
        found.pop("predictions")
        expected = {k: v for k, v in expected.items() if k != "predictions"}
    assert_same(found, expected, exact, task)
