"""The seq2seq task end to end on a tiny BERT2BERT: fine-tuning through the one trainer
(teacher forcing, evaluation by generation scored with BLEU/chrF/ROUGE-L, predictions in the
workdir, the exported model), `python -m bertjax.predict generate`, and its named errors."""
import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from bertjax.tasks import base as tasks
from bertjax.training import finetune
from bertjax.training.inference import TaskPredictor
from finetune_helpers import sentences, tiny_config, tiny_model_dir, write_tsv
from benchmarks.task_data import wordpiece

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pairs(count, start):
    """Source: an Austen sentence; target: its first three words (a learnable shortening)."""
    return [(s, " ".join(s.split()[:3])) for s in sentences(count, start=start)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq")
    data = {name: write_tsv(str(root / f"{name}.tsv"), rows, ("source", "target"))
            for name, rows in (("train", _pairs(32, 0)), ("dev", _pairs(8, 40)))}
    config = tiny_config(tiny_model_dir(str(root / "tiny")), type="seq2seq",
                         text_columns="source", label_column="target",
                         train_file=data["train"], eval_files=data["dev"],
                         max_target_length=12, num_beams=2, label_smoothing=0.1)
    workdir = root / "run"
    result = finetune.finetune(config, str(workdir), jax.devices()[:1])
    return workdir, data, result


@pytest.mark.xdist_group("seq2seq_run")  # one worker fine-tunes `run` once
def test_run_scores_generations_and_writes_them(run):
    workdir, _, result = run
    final = result["results"]["dev"]["final"]["metrics"]
    assert set(final) == {"bleu", "chrf", "rougeL"}
    assert all(0.0 <= v <= 100.0 for v in final.values())
    records = [json.loads(l) for l in (workdir / "predictions/dev.jsonl").read_text()
               .splitlines()]
    assert len(records) == 8 and {"source", "target", "prediction"} <= set(records[0])
    kept = json.loads((workdir / "model/task.json").read_text())
    assert kept["type"] == "seq2seq" and kept["num_beams"] == 2
    # The exported model generates what the run's evaluation generated.
    predictor = TaskPredictor(str(workdir / "model"), command="generate")
    again = predictor.predict(predictor.task.examples_from_texts([r["source"] for r in records]))
    assert [r["prediction"] for r in again] == [r["prediction"] for r in records]


@pytest.mark.xdist_group("seq2seq_run")  # one worker fine-tunes `run` once
def test_predict_generate_cli_and_a_model_of_another_task(run, tmp_path):
    workdir, data, _ = run
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = tmp_path / "out.jsonl"
    cli = subprocess.run(
        [sys.executable, "-m", "bertjax.predict", "generate", f"--checkpoint={workdir}",
         f"--input={data['dev']}", "--text_columns=source", f"--output={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert len(out.read_text().splitlines()) == 8
    other = tmp_path / "classifier"
    shutil.copytree(workdir / "model", other)
    (other / tasks.TASK_FILE).write_text(json.dumps({"type": "regression",
                                                     "max_seq_length": 16}))
    wrong = subprocess.run(
        [sys.executable, "-m", "bertjax.predict", "generate", f"--checkpoint={other}",
         "--text=Emma smiled."], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0
    assert "is a regression model: use `python -m bertjax.predict classify`" in wrong.stderr


def test_named_errors_for_an_empty_source_and_a_long_target(tmp_path):
    task = tasks.get("seq2seq")(tiny_config("unused", type="seq2seq", text_columns="source",
                                            label_column="target", max_target_length=6).task)
    path = write_tsv(str(tmp_path / "bad.tsv"), [("Emma smiled.", "ok"), (" ", "ok")],
                     ("source", "target"))
    with pytest.raises(ValueError, match=r"bad.tsv:3: the source is empty"):
        task.featurize(task.read(path, labelled=True), wordpiece(), None)
    path = write_tsv(str(tmp_path / "long.tsv"),
                     [("Emma smiled.", "a target of many more words than six tokens")],
                     ("source", "target"))
    with pytest.raises(ValueError, match=r"long.tsv:2: the target is 12 tokens .* "
                                         r"task.max_target_length 6"):
        task.featurize(task.read(path, labelled=True), wordpiece(), None)


def test_several_examples_a_row_are_refused_for_generation():
    # BERT2BERT's forward reads no packing inputs: packed rows would train every source as
    # one text. The task declares it cannot pack, and the config check enforces that.
    from bertjax.training import finetune_config
    for kind in ("seq2seq", "unilm"):
        config = tiny_config("model", type=kind, train_file="train.tsv")
        finetune_config.validate(config)
        config.train.examples_per_row = 2
        with pytest.raises(ValueError, match=f"examples_per_row 2: task.type {kind} cannot "
                                             f"hold several examples in a row"):
            finetune_config.validate(config)


def test_decoder_warm_starts_from_the_encoder_or_the_checkpoint():
    import flax.linen as nn
    import numpy as np
    from bertjax.models.heads import init_params
    from finetune_helpers import TINY

    task = tasks.get("seq2seq")(tiny_config("unused", type="seq2seq").task)
    fresh = nn.unbox(init_params(task.model(TINY, None), jax.random.PRNGKey(0)))
    encoder, decoder = fresh["bert"], fresh["decoder"]

    warm = task.warm_start(fresh, {})
    layer, enc_layer = (warm["decoder"]["bert"]["encoder"]["layer_1"],
                        encoder["encoder"]["layer_1"])
    for name in ("attention", "attention_layer_norm", "intermediate", "output"):
        jax.tree.map(np.testing.assert_array_equal, layer[name], enc_layer[name])
    jax.tree.map(np.testing.assert_array_equal, warm["decoder"]["bert"]["embeddings"],
                 encoder["embeddings"])
    jax.tree.map(np.testing.assert_array_equal, layer["crossattention"],
                 decoder["bert"]["encoder"]["layer_1"]["crossattention"])  # fresh
    mlm = jax.tree.map(lambda x: x + 1, decoder["mlm"])  # a pretraining checkpoint's head
    assert task.warm_start(fresh, {"mlm": mlm})["decoder"]["mlm"] is mlm
    trained = jax.tree.map(lambda x: x * 2, decoder)  # a converted EncoderDecoderModel's
    assert task.warm_start(fresh, {"decoder": trained})["decoder"] is trained
    shorter = {**trained, "bert": {**trained["bert"], "encoder": {
        "layer_0": trained["bert"]["encoder"]["layer_0"]}}}
    with pytest.raises(ValueError, match="init_checkpoint's decoder does not fit the model"):
        task.warm_start(fresh, {"decoder": shorter})

    # The baseline warm-starting is measured against: a fresh decoder, whatever the checkpoint.
    cold = tasks.get("seq2seq")(tiny_config("unused", type="seq2seq",
                                            warm_start_decoder=False).task)
    assert cold.warm_start(fresh, {"decoder": trained, "mlm": mlm})["decoder"] is decoder

    tied_task = tasks.get("seq2seq")(tiny_config("unused", type="seq2seq",
                                                 tie_encoder_decoder=True).task)
    tied = nn.unbox(init_params(tied_task.model(TINY, None), jax.random.PRNGKey(0)))
    warm = tied_task.warm_start(tied, {"mlm": mlm})
    assert warm["decoder"]["mlm"] is mlm and warm["bert"] is tied["bert"]
    assert set(warm["decoder"]["bert"]["encoder"]["layer_0"]) == {
        "crossattention", "crossattention_layer_norm"}
    tied_cold = tasks.get("seq2seq")(tiny_config(
        "unused", type="seq2seq", tie_encoder_decoder=True, warm_start_decoder=False).task)
    with pytest.raises(ValueError, match="a tied decoder is the encoder"):
        tied_cold.warm_start(tied, {})


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_loss_is_optax_cross_entropy_on_smoothed_one_hot_labels(smoothing):
    import numpy as np
    import optax
    from bertjax.tasks.seq2seq import token_cross_entropy

    logits = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 41)) * 4
    labels = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 0, 41)
    expected = optax.softmax_cross_entropy(
        logits, optax.smooth_labels(jax.nn.one_hot(labels, 41), smoothing))
    np.testing.assert_allclose(token_cross_entropy(logits, labels, smoothing), expected,
                               rtol=1e-5, atol=1e-6)


def test_a_prepared_tfds_dataset_feeds_source_and_target():
    import tensorflow_datasets as tfds

    config = tiny_config("unused", type="seq2seq", tfds_name="gigaword",
                         tfds_eval_splits="validation", text_columns="document",
                         label_column="summary", max_target_length=48)
    task = tasks.get("seq2seq")(config.task)
    with tfds.testing.mock_data(num_examples=5):
        data = task.load(wordpiece())
        with pytest.raises(ValueError, match=r"TFDS dataset gigaword has no feature 'target' "
                                             r"\(set task.text_columns .* it has document, "
                                             r"summary\)"):
            task.settings.label_column = "target"
            task.read_tfds("gigaword", "train", None)
    assert len(data.train.examples) == 5 and [s.name for s in data.evals] == ["validation"]
    example = data.train.examples[0]
    assert example.guid == "tfds:gigaword/train:0" and example.text_a and example.label
    assert set(data.train.features.arrays) == {"input_ids", "input_mask", "segment_ids",
                                               "target_ids", "target_mask"}
