"""The fine-tuning loop's mechanics on a tiny random BERT: what a run leaves behind, exact
resume after preemption, sharded = single-device, starting from a pretraining workdir, the
head learning-rate multiplier, and clear errors."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import real_data
from bertjax.data.tokenizers import load_tokenizer
from bertjax.training import checkpoints, config_sections, finetune
from bertjax.training.inference import TaskPredictor
from finetune_helpers import (TINY, classification_files, tiny_config, tiny_model_dir,
                              tiny_pretraining_params, tiny_pretraining_workdir)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return classification_files(str(tmp_path_factory.mktemp("data")))


def _config(tiny_dir, files, **task):
    return tiny_config(tiny_dir, **{"train_file": files["train"], "eval_files": files["dev"],
                                    **task})


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_dir, files):
    """Two epochs without interruption, with a file to predict."""
    workdir = tmp_path_factory.mktemp("straight")
    config = _config(tiny_dir, files, predict_files=files["test"])
    return workdir, finetune.finetune(config, str(workdir), jax.devices()[:1])


def test_run_leaves_results_predictions_and_a_usable_model(straight_run, files):
    tmp_path, out = straight_run
    assert out["step"] == 8  # 64 examples / batch 16 x 2 epochs

    results = json.loads((tmp_path / "eval_results.json").read_text())
    dev = results["sets"]["dev"]
    assert [dev["final"]["step"], results["best_metric"]] == [8, "accuracy"]
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_dev_accuracy" in r]
    assert [r["step"] for r in evals] == [4, 8]
    assert dev["best"]["metrics"]["accuracy"] == max(r["eval_dev_accuracy"] for r in evals)
    assert [r["step"] for r in records if "loss" in r] == [2, 4, 6, 8]
    assert "best_dev_accuracy" in records[-1] and "final_dev_mcc" in records[-1]

    predictions = [json.loads(l) for l in (tmp_path / "predictions/dev.jsonl").read_text()
                   .splitlines()]
    assert len(predictions) == 20 and {"label", "prediction", "probability"} <= set(predictions[0])
    accuracy = np.mean([p["label"] == p["prediction"] for p in predictions])
    assert accuracy == pytest.approx(dev["final"]["metrics"]["accuracy"])
    assert sum(predictions[0]["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    test = (tmp_path / "predictions/test.jsonl").read_text().splitlines()
    assert len(test) == 20 and "label" not in json.loads(test[0])

    # The exported model predicts what the run predicted.
    predictor = TaskPredictor(str(tmp_path / "model"))
    examples = predictor.examples_from_file(files["dev"])
    again = predictor.predict(examples)
    assert [p["prediction"] for p in again] == [p["prediction"] for p in predictions]
    np.testing.assert_allclose([p["probability"] for p in again],
                               [p["probability"] for p in predictions], atol=1e-5)


def test_resume_after_preemption_is_exact(tmp_path, tiny_dir, files, straight_run,
                                         monkeypatch):
    straight = straight_run[1]
    config = _config(tiny_dir, files)

    def preempt_at_3(self, step):
        return step == 3

    with monkeypatch.context() as m:
        m.setattr(checkpoints.RunCheckpoints, "preemption_requested", preempt_at_3)
        first = finetune.finetune(config, str(tmp_path / "resumed"), jax.devices()[:1])
    assert first["preempted"] and first["step"] == 3
    assert not (tmp_path / "resumed/eval_results.json").exists()
    second = finetune.finetune(config, str(tmp_path / "resumed"), jax.devices()[:1])
    assert second["step"] == 8 and not second["preempted"]
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(second["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert second["results"] == straight["results"]


def test_sharded_run_matches_single_device(tmp_path, tiny_dir, files, straight_run):
    single = straight_run[1]
    config = _config(tiny_dir, files)
    config.mesh.shape = (4, 2, 1)
    sharded = finetune.finetune(config, str(tmp_path / "eight"), jax.devices()[:8])
    for a, b in zip(jax.tree.leaves(single["params"]), jax.tree.leaves(sharded["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    assert sharded["results"]["dev"]["final"]["metrics"]["accuracy"] == pytest.approx(
        single["results"]["dev"]["final"]["metrics"]["accuracy"])


def test_encoder_from_a_pretraining_workdir_and_truncated(tmp_path):
    workdir = tiny_pretraining_workdir(tmp_path / "pretrain", seed=3)
    params = tiny_pretraining_params(seed=3)
    source = checkpoints.open_model(str(workdir))
    assert source.config.to_dict() == TINY.to_dict()
    assert load_tokenizer(source.tokenizer_dir).vocab_size == TINY.vocab_size
    from bertjax.training import sharding
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    bert = finetune.load_encoder(source, 1, mesh, config_sections.DEFAULT_RULES)
    assert sorted(bert["encoder"]) == ["layer_0"]
    for a, b in zip(jax.tree.leaves(bert["encoder"]["layer_0"]),
                    jax.tree.leaves(params["bert"]["encoder"]["layer_0"])):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_head_learning_rate_multiplier_scales_only_the_head():
    config = tiny_config("")
    params = {"bert": {"w": np.ones(3, np.float32)}, "classifier": {"w": np.ones(3, np.float32)}}
    grads = {"bert": {"w": np.array([1.0, -2.0, 3.0], np.float32)},
             "classifier": {"w": np.array([1.0, -2.0, 3.0], np.float32)}}
    updates = {}
    for multiplier in (1.0, 10.0):
        config.optimizer.head_lr_multiplier = multiplier
        tx, _ = finetune.make_optimizer(config.optimizer, 100)
        updates[multiplier], _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates[10.0]["bert"]["w"], updates[1.0]["bert"]["w"])
    np.testing.assert_allclose(updates[10.0]["classifier"]["w"],
                               10 * np.asarray(updates[1.0]["classifier"]["w"]), rtol=1e-6)


def test_clear_errors(tmp_path, tiny_dir, files):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\nsome words here\tmedium\n")
    with pytest.raises(ValueError, match=r"dev.tsv:2: label 'medium' does not occur in the "
                                         r"training data"):
        finetune.finetune(_config(tiny_dir, files, eval_files=str(dev)), str(tmp_path / "a"))
    with pytest.raises(ValueError, match=r"train.tsv: no column 'text'; it has columns "
                                         r"\['sentence', 'label'\]"):
        finetune.finetune(_config(tiny_dir, files, text_columns="text"), str(tmp_path / "b"))
    with pytest.raises(ValueError, match="init_checkpoint is not set"):
        finetune.finetune(_config("", files), str(tmp_path / "c"))
    config = _config(tiny_dir, files)
    config.train.global_batch_size = 128
    with pytest.raises(ValueError, match="the training set has 64 features, fewer than "
                                         "train.global_batch_size 128"):
        finetune.finetune(config, str(tmp_path / "d"))
    config = _config(tiny_dir, files)
    config.model.keep_layers = 5
    with pytest.raises(ValueError, match="model.keep_layers 5: the checkpoint has 2"):
        finetune.finetune(config, str(tmp_path / "e"))
    with pytest.raises(ValueError, match="task.best_metric 'loss': for classification expected "
                                         "one of accuracy, macro_f1, mcc, f1"):
        finetune.finetune(_config(tiny_dir, files, best_metric="loss"), str(tmp_path / "f"))


def test_squad_v2_run_reports_no_answer_scores_and_official_answers(tmp_path, tiny_dir):
    examples = real_data.austen_questions()[:48]
    answerable = [dataclasses.asdict(e) for e in examples]
    unanswerable = [{**e, "qid": "no" + e["qid"], "question": real_data.WHERE, "answers": [],
                     "answer_start": -1, "answer_text": "", "is_impossible": True}
                    for e in answerable if e["question"] == real_data.WHO][:16]
    qas = answerable + unanswerable
    data = {"version": "v2.0", "data": [{"title": q["qid"], "paragraphs": [{
        "context": q["context"], "qas": [{
            "id": q["qid"], "question": q["question"], "is_impossible": q["is_impossible"],
            "answers": ([{"text": q["answer_text"], "answer_start": q["answer_start"]}]
                        if not q["is_impossible"] else [])}]}]} for q in qas]}
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(data))
    config = tiny_config(tiny_dir, type="squad", train_file=str(path), eval_files=str(path),
                         version_2=True, max_seq_length=48, doc_stride=16, max_query_length=12)
    config.train.num_epochs = 1.0
    out = finetune.finetune(config, str(tmp_path / "run"), jax.devices()[:1])
    metrics = out["results"]["qa"]["final"]["metrics"]
    assert metrics["total"] == len(qas) and metrics["NoAns_total"] == len(unanswerable)
    assert {"HasAns_f1", "best_f1", "best_f1_thresh"} <= set(metrics)
    assert metrics["best_f1"] >= metrics["f1"] - 1e-9  # the threshold search can only help
    answers = json.loads((tmp_path / "run/predictions/qa.answers.json").read_text())
    assert set(answers) == {q["qid"] for q in qas}
    records = [json.loads(l) for l in (tmp_path / "run/predictions/qa.jsonl").read_text()
               .splitlines()]
    assert all(r["prediction"] in ("", r["best_span"]) and "null_odds" in r for r in records)


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs",
                                                                   "finetune"))
                                         if f.endswith(".py")))
def test_finetune_configs_have_every_key_and_their_command(name):
    import importlib.util
    from bertjax.training import finetune_config
    path = os.path.join(ROOT, "configs", "finetune", f"{name}.py")
    spec = importlib.util.spec_from_file_location("config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    assert _keys(config) == _keys(finetune_config.defaults(config.task.type))
    assert config.mode == "finetune"
    assert (f"python -m bertjax.main --config=configs/finetune/{name}.py --workdir="
            in module.__doc__)


def _keys(config, prefix=""):
    keys = set()
    for k, v in config.items():
        keys |= _keys(v, f"{prefix}{k}.") if hasattr(v, "items") else {prefix + k}
    return keys


def test_command_line_fine_tunes_and_predicts(tmp_path, tiny_dir, files):
    workdir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bertjax.main",
         "--config=configs/finetune/classify.py",
         f"--workdir={workdir}", f"--config.init_checkpoint={tiny_dir}",
         f"--config.task.train_file={files['train']}", f"--config.task.eval_files={files['dev']}",
         "--config.task.max_seq_length=16", "--config.train.global_batch_size=16",
         "--config.train.eval_batch_size=16", "--config.train.num_epochs=1",
         "--config.mesh.shape=(1,1,-1)", "--config.train.profile_steps=(1,3)",
         f"--config.train.compilation_cache_dir={tmp_path / 'jax-cache'}",
         "--jax_platforms=cpu"],  # JAX's own flags are accepted too
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "eval dev at step 4 (epoch 1): accuracy" in run.stdout
    # A pod user can tell a slow compile from a hang: what runs where, and the first step.
    assert "process 0 of 1 | " in run.stdout and " parameters, float32 compute" in run.stdout
    assert "first step (compiling included) in" in run.stdout
    # MFU is a fraction of some peak: the start-up line says which.
    assert re.search(r"MFU against a peak of [\d,]+ GFLOP/s", run.stdout)
    assert list((workdir / "profile").rglob("*.xplane.pb")), "no trace of steps 1-2"
    assert list((tmp_path / "jax-cache").iterdir()), "nothing in the compilation cache"
    assert json.loads((workdir / "eval_results.json").read_text())["sets"]["dev"]["final"]
    # TensorBoard events are written without TensorFlow, which fine-tuning needs for nothing
    # else (importing it costs seconds at start and at exit).
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tensorboard" in imported and "tensorflow" not in imported
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))

    predict = subprocess.run(
        [sys.executable, "-m", "bertjax.predict", "classify", f"--checkpoint={workdir}",
         "--text=It was a truth universally acknowledged.", "--text=Emma smiled."],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert predict.returncode == 0, predict.stderr[-3000:]
    lines = predict.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[1].split()[0] in ("long", "short")
    assert 0.5 <= float(lines[1].split()[1]) <= 1.0
    wrong = subprocess.run(
        [sys.executable, "-m", "bertjax.predict", "qa", f"--checkpoint={workdir}", "--text=Who?"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0
    assert "is a classification model: use `python -m bertjax.predict classify`" in wrong.stderr
