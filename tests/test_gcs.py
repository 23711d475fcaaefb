"""Every path a gs:// URL, for real: prepare -> pretrain (a checkpoint, then a resume) -> the
exported model -> fine-tune -> predict, and conversion between the three checkpoint formats,
against a local Cloud Storage emulator (tests/gcs_emulator.py) that the test starts on 127.0.0.1.

Each library reaches the emulator through its own documented setting, except TensorFlow's GCS
client, which has none and is reached through an HTTPS proxy that sends googleapis.com to the
emulator: the bytes go through the same client code as in a real run. What the emulator
cannot stand for: real authentication (a fixed test token is used), hierarchical-namespace
and zonal buckets, and Cloud Storage's throttling and latency.
"""
import json
import os
import subprocess
import tempfile

import numpy as np
import pytest

import gcs_emulator
from config_commands import ROOT, parse
from bertjax import convert, main
from bertjax.convert import params as cparams
from bertjax.data import corpus as corpus_lib
from bertjax.data import preparation
from bertjax.training import inference
from finetune_helpers import classification_files, tiny_model_dir
from benchmarks.task_data import MINILM_DIR, austen_paragraphs

BUCKET = "bertjax-test"
PRETRAIN = ["--config=configs/tiny.py",
            "--config.model.num_hidden_layers=1", "--config.model.hidden_size=32",
            "--config.model.num_attention_heads=2", "--config.model.intermediate_size=37",
            "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
            "--config.data.heldout_fraction=0.3", "--config.train.global_batch_size=8",
            "--config.train.log_every=2", "--config.train.eval_every=2",
            "--config.train.eval_batches=1", "--config.train.checkpoint_every=2",
            "--config.train.peak_flops_per_device=1e9", "--config.quiet=true"]


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    emulator = gcs_emulator.start(tmp_path)
    try:
        for name, value in emulator.env.items():
            monkeypatch.setenv(name, value)
        emulator.create_bucket(BUCKET)
        yield emulator
    finally:
        emulator.stop()


def _untracked() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True)
    return set(out.stdout.splitlines()) if out.returncode == 0 else set()


def test_prepare_pretrain_resume_finetune_predict_all_on_gcs(gcs, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the configs are named relative to the checkout
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # local staging stays in here
    before = _untracked()
    root = f"gs://{BUCKET}"
    paragraphs = austen_paragraphs()
    for i in range(20):
        gcs.upload(BUCKET, f"corpus/book{i}.txt",
                   "\n\n".join(paragraphs[15 * i:15 * i + 15]).encode())
    with open(os.path.join(MINILM_DIR, "vocab.txt"), "rb") as f:
        gcs.upload(BUCKET, "vocab/vocab.txt", f.read())
    for name, path in classification_files(str(tmp_path)).items():
        with open(path, "rb") as f:
            gcs.upload(BUCKET, f"task/{name}.tsv", f.read())

    manifest = preparation.prepare(
        corpus_lib.Corpus(f"{root}/corpus/*.txt", "text"), f"{root}/shards",
        tokenizer=f"{root}/vocab/vocab.txt", num_shards=2, quiet=True)
    assert manifest["documents"] == 20
    assert {"shards/manifest.json", "shards/vocab.txt"} <= set(gcs.objects(BUCKET, "shards/"))

    pretrain = [*PRETRAIN, f"--workdir={root}/pretrain", f"--config.data.shard_dir={root}/shards"]
    main.run_mode(*parse([*pretrain, "--config.train.num_steps=2"]))
    main.run_mode(*parse([*pretrain, "--config.train.num_steps=4"]))  # resumes from step 2
    saved = {n.split("/")[2] for n in gcs.objects(BUCKET, "pretrain/checkpoints/")}
    assert {"2", "4"} <= saved, saved
    records = [json.loads(line) for line in
               gcs.download(BUCKET, "pretrain/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [2, 4]  # logged every 2 steps, once
    assert any(n.startswith("pretrain/tensorboard/events.out.tfevents")
               for n in gcs.objects(BUCKET, "pretrain/tensorboard/"))
    assert "pretrain/model/config.json" in gcs.objects(BUCKET, "pretrain/model/")
    (masks,) = inference.fill_mask(f"{root}/pretrain", ["She was [MASK] happy."], top_k=2)
    assert len(masks) == 1 and len(masks[0]) == 2

    config, workdir = parse([
        "--config=configs/finetune/classify.py", f"--workdir={root}/finetune",
        f"--config.init_checkpoint={root}/pretrain",
        f"--config.task.train_file={root}/task/train.tsv",
        f"--config.task.eval_files={root}/task/dev.tsv",
        f"--config.task.predict_files={root}/task/test.tsv",
        "--config.task.max_seq_length=16", "--config.train.global_batch_size=16",
        "--config.train.eval_batch_size=16", "--config.train.num_epochs=1",
        "--config.quiet=true"])
    main.run_mode(config, workdir)
    results = json.loads(gcs.download(BUCKET, "finetune/eval_results.json"))
    assert 0.0 <= results["sets"]["dev"]["final"]["metrics"]["accuracy"] <= 1.0
    assert len(gcs.download(BUCKET, "finetune/predictions/test.jsonl").splitlines()) == 20
    assert {"finetune/model/task.json", "finetune/model/labels.json",
            "finetune/labels.json"} <= set(gcs.objects(BUCKET, "finetune/"))

    predictor = inference.TaskPredictor(f"{root}/finetune")
    records = predictor.predict(predictor.examples_from_file(f"{root}/task/test.tsv"))
    assert len(records) == 20 and {r["prediction"] for r in records} <= {"long", "short"}
    assert _untracked() == before  # nothing landed in the checkout


def test_convert_reads_and_writes_gcs(gcs, tmp_path, monkeypatch):
    """bertjax -> Hugging Face -> bertjax -> TF -> bertjax with every input and output in the
    bucket gives the files and parameters the same conversions give on a local disk."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # local staging stays in here
    quiet = dict(log=lambda _: None, warn=lambda _: None)
    start = tiny_model_dir(str(tmp_path / "start"))
    chain = [("bertjax", "hf"), ("hf", "bertjax"), ("bertjax", "tf"), ("tf", "bertjax")]
    outputs = {}
    for where, root in (("local", str(tmp_path / "local")), ("gcs", f"gs://{BUCKET}")):
        source = start
        for i, (src, dst) in enumerate(chain):
            # The last step writes to a local disk, where the two chains are compared.
            output = (f"{root}/{i}-{dst}" if i < len(chain) - 1
                      else str(tmp_path / where / "end"))
            convert.convert(source, output, src=src, dst=dst, **quiet)
            source = output
        outputs[where] = source

    local = tmp_path / "local"
    for name in ("model.safetensors", "config.json", "vocab.txt"):
        assert gcs.download(BUCKET, f"0-hf/{name}") == (local / "0-hf" / name).read_bytes(), name
    uploaded = set(gcs.objects(BUCKET, ""))
    assert {"1-bertjax/config.json", "1-bertjax/vocab.txt", "2-tf/bert_config.json",
            "2-tf/bert_model.ckpt.index", "2-tf/checkpoint", "2-tf/vocab.txt"} <= uploaded
    want = cparams.flatten(convert.read("bertjax", outputs["local"]).params)
    got = cparams.flatten(convert.read("bertjax", outputs["gcs"]).params)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    assert (tmp_path / "gcs" / "end" / "vocab.txt").read_bytes() == (
        tmp_path / "start" / "vocab.txt").read_bytes()
