"""configs/base.py and configs/large.py run as their docstrings say: prepare a corpus with
BERT's WordPiece vocabulary, pretrain phase 1 (seq 128), then phase 2 (seq 512) from phase
1's workdir. Each command is taken from the docstring and parsed by the real flag parser;
only the bucket, the corpus and the budget (a tiny model, two steps) are swapped in."""
import os
import subprocess
import sys

import numpy as np
import pytest

from config_commands import ROOT, docstring_commands, parse
from bertjax import main
from bertjax.training import checkpoints
from benchmarks.task_data import MINILM_DIR, austen_paragraphs

SHRINK = ["--config.model.num_hidden_layers=2", "--config.model.hidden_size=128",
          "--config.model.num_attention_heads=2", "--config.model.intermediate_size=512",
          "--config.train.num_steps=2",
          "--config.train.global_batch_size=8", "--config.train.log_every=1",
          "--config.train.evaluate=false", "--config.train.checkpoint_every=2",
          "--config.optimizer.warmup_steps=1", "--config.quiet=true"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """Twenty Austen 'books' of thirty paragraphs, one text file each."""
    directory = tmp_path_factory.mktemp("corpus")
    paragraphs = austen_paragraphs()
    for i in range(20):
        (directory / f"book{i:02d}.txt").write_text(
            "\n".join(paragraphs[600 + 30 * i:630 + 30 * i]), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """Stands for gs://BUCKET: both configs prepare the same corpus there (the second
    `prepare` finds it done)."""
    return tmp_path_factory.mktemp("bucket")


@pytest.mark.parametrize("name", ["base", "large"])
def test_two_phase_commands_run_as_written(name, corpus_dir, bucket, monkeypatch):
    monkeypatch.chdir(ROOT)

    def local(arg: str) -> str:
        return (arg.replace("gs://BUCKET", str(bucket))
                .replace("corpus/*.txt", f"{corpus_dir}/*.txt")
                .replace("uncased_L-12_H-768_A-12/vocab.txt", f"{MINILM_DIR}/vocab.txt"))

    commands = [[local(a) for a in c] for c in docstring_commands(f"configs/{name}.py")]
    assert [c[2] for c in commands] == ["bertjax.prepare", "bertjax.main", "bertjax.main"]
    prepare, phase1, phase2 = commands
    if name == "large":
        # large.py is base.py at another model size, which SHRINK replaces: running it would
        # repeat base's run. Its commands parse, with the phases' lengths, and chain as base's.
        workdirs = []
        for args, lengths in ((phase1, (128, 20)), (phase2, (512, 80))):
            config, workdir = parse([*args[3:], *SHRINK])
            assert (config.data.max_seq_length, config.data.max_predictions_per_seq) == lengths
            workdirs.append(workdir)
        assert f"--config.init_checkpoint={workdirs[0]}" in phase2
        return
    run = subprocess.run([sys.executable, *prepare[1:], "--quiet"], cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]

    workdirs = []
    for args, (seq_len, predictions) in ((phase1, (128, 20)), (phase2, (512, 80))):
        config, workdir = parse([*args[3:], *SHRINK])
        assert (config.data.max_seq_length, config.data.max_predictions_per_seq) == (
            seq_len, predictions)
        main.run_mode(config, workdir)
        workdirs.append(workdir)
    assert f"--config.init_checkpoint={workdirs[0]}" in phase2

    # Phase 2 started from phase 1's parameters: two small steps away, not a fresh init.
    _, first = checkpoints.load_model(os.path.join(workdirs[0], "model"))
    _, second = checkpoints.load_model(os.path.join(workdirs[1], "model"))
    embeddings = [np.asarray(p["bert"]["embeddings"]["word_embeddings"]["embedding"])
                  for p in (first, second)]
    assert np.abs(embeddings[1] - embeddings[0]).max() < 1e-3
