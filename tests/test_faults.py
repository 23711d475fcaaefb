"""What a week-long run meets, each as it happens to users: corrupt checkpoints and model
directories, damaged shards, a diverged state, runs killed mid-write, a full disk, and the
errors a user can act on, each one line naming the file, key or value."""
import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import pretrain_helpers as ph
from bertjax import cli, files
from bertjax.data import corpus as corpus_lib
from bertjax.data import preparation, shards
from bertjax.training import checkpoints, inference, pretrain
from config_commands import ROOT
from finetune_helpers import tiny_model_dir
from benchmarks.task_data import MINILM_DIR

TIMING = ("seq_per_sec", "mfu")


def records(workdir) -> list[dict]:
    lines = pathlib.Path(workdir, "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def event_steps(workdir) -> list[int]:
    from tensorflow.core.util import event_pb2
    steps = []
    for name in sorted(pathlib.Path(workdir, "tensorboard").glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(name)):
            event = event_pb2.Event.FromString(record.numpy())
            steps += [event.step for v in event.summary.value if v.tag == "loss"]
    return steps


def run(workdir, **train):
    config = ph.tiny_config(**{"checkpoint_every": 2, "keep_checkpoints": 3, **train})
    return pretrain.train(config, str(workdir), ph.synthetic_data(config))


def damage(directory: pathlib.Path, payload: bytes) -> pathlib.Path:
    """Overwrites bytes in the middle of the largest data file under `directory`."""
    target = max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    middle = len(data) // 2
    data[middle:middle + len(payload)] = payload[:len(data) - middle]
    target.write_bytes(bytes(data))
    return target


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    run(workdir)
    return records(workdir)


@pytest.mark.xdist_group("faults_reference")  # one worker runs `reference` once
@pytest.mark.parametrize("garbage", ["finite", "nan"])
def test_a_corrupt_latest_checkpoint_is_named_and_the_run_falls_back(garbage, reference,
                                                                      tmp_path, capsys):
    run(tmp_path)
    payload = (np.random.default_rng(0).normal(size=1024).astype(np.float32) if garbage == "finite"
               else np.full(1024, np.nan, np.float32)).tobytes()
    damage(tmp_path / "checkpoints" / "6" / "params", payload)
    config = ph.tiny_config(checkpoint_every=2, keep_checkpoints=3, restore_fallback=False)
    with pytest.raises(checkpoints.CorruptCheckpoint, match=r"checkpoints/6.* (is corrupt|cannot "
                       r"be read|holds non-finite).*restore_fallback is off"):
        pretrain.train(config, str(tmp_path), ph.synthetic_data(config))

    out = run(tmp_path)  # the same command, with the default fallback
    assert "checkpoints/6" in capsys.readouterr().err and out["step"] == 6
    assert records(tmp_path) == reference  # steps 5 and 6 done again, exactly


@pytest.mark.xdist_group("faults_reference")  # one worker runs `reference` once
def test_a_missing_checkpoint_item_falls_back_to_an_older_checkpoint(reference, tmp_path,
                                                                      capsys):
    run(tmp_path)
    files.remove_tree(tmp_path / "checkpoints" / "6" / "opt_state")
    run(tmp_path)
    assert "checkpoints/6 cannot be read" in capsys.readouterr().err
    assert records(tmp_path) == reference


def test_a_state_that_is_not_finite_is_never_saved(tmp_path):
    config = ph.tiny_config(checkpoint_every=1)
    # Not representable in float32: the first update makes the parameters infinite while the
    # loss and gradient of that step (computed before it) are still finite.
    config.optimizer.learning_rate, config.optimizer.warmup_steps = 1e39, 0
    with pytest.raises(FloatingPointError, match=r"state after step 1 holds non-finite values .* "
                       r"stopped without saving \(no checkpoint was saved\)"):
        pretrain.train(config, str(tmp_path), ph.synthetic_data(config))
    assert not list((tmp_path / "checkpoints").glob("[0-9]*"))


def test_a_corrupt_model_directory_is_one_line(tmp_path):
    model = tiny_model_dir(str(tmp_path / "model"))
    damage(pathlib.Path(model) / "params", b"\x7f\xc0\x00\x00" * 1024)
    with pytest.raises(checkpoints.CorruptCheckpoint, match=r"model/params"):
        inference.fill_mask(model, ["It was [MASK]."], top_k=1)


def test_a_model_config_whose_layer_count_does_not_match_its_parameters(tmp_path):
    model = pathlib.Path(tiny_model_dir(str(tmp_path / "model")))
    config = json.loads((model / "config.json").read_text())
    for layers, problem in ((3, "missing bert/encoder/layer_2"),
                            (1, "unexpected bert/encoder/layer_1")):
        (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        with pytest.raises(ValueError, match=f"does not match the model.*{problem}"):
            inference.fill_mask(str(model), ["It was [MASK]."], top_k=1)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("corpus") / "shards")
    documents = ["\n\n".join(f"Sentence {d} {i} of the book." for i in range(30))
                 for d in range(12)]
    source = tmp_path_factory.mktemp("text") / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents))
    preparation.prepare(corpus_lib.Corpus(str(source), "jsonl"), out,
                        tokenizer=os.path.join(MINILM_DIR, "vocab.txt"), num_shards=2, quiet=True)
    return out


def _load(directory: str):
    from bertjax.data import pretraining, tokenizers
    vocab = pretraining.Vocab.from_tokenizer(tokenizers.load_tokenizer(directory))
    return pretraining.pretraining_dataset(directory, vocab=vocab, max_seq_length=32,
                                           max_predictions_per_seq=5, global_batch_size=4,
                                           seed=0)


@pytest.mark.parametrize("fault", ["truncated at a record boundary", "truncated mid-record",
                                   "a flipped byte"])
def test_a_damaged_shard_is_an_error_naming_it(fault, shard_dir, tmp_path):
    copy = tmp_path / "shards"
    subprocess.run(["cp", "-r", shard_dir, str(copy)], check=True)
    name = shards.read_manifest(str(copy))["shards"][0]
    path = copy / name
    records_ = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    if fault == "truncated at a record boundary":
        with tf.io.TFRecordWriter(str(path)) as writer:
            for record in records_[:-2]:
                writer.write(record)
        expected = r"holds \d+ documents and \d+ tokens, the manifest says"
    elif fault == "truncated mid-record":
        path.write_bytes(path.read_bytes()[:-20])
        expected = "is corrupt"
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
        expected = "is corrupt"
    with pytest.raises(ValueError, match=f"shard .*{name} {expected}"):
        next(_load(str(copy)))


def _crash_then_resume(tmp_path, crash_at: int, checkpoint_every: int):
    """A run killed by SIGKILL when it reads batch `crash_at`, then the same run again."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(pathlib.Path(ROOT, 'tests'))!r})\n"
        "import pretrain_helpers as ph\n"
        "from bertjax.training import pretrain\n"
        f"config = ph.tiny_config(checkpoint_every={checkpoint_every})\n"
        "data = ph.synthetic_data(config)\n"
        "train = data.train\n"
        "class Killed:\n"
        "    def __init__(self, it): self.it = it\n"
        "    def __next__(self):\n"
        f"        if self.it.step == {crash_at}: os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return next(self.it)\n"
        "    def position(self): return self.it.position()\n"
        "data.train = lambda p: Killed(train(p))\n"
        f"pretrain.train(config, {str(tmp_path / 'run')!r}, data)\n")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu",
           "JAX_NUM_CPU_DEVICES": "8"}  # the devices this process has
    killed = subprocess.run([sys.executable, str(driver)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return tmp_path / "run"


@pytest.mark.xdist_group("faults_reference")  # one worker runs `reference` once
@pytest.mark.parametrize("checkpoint_every", [100, 2])
def test_a_killed_run_resumes_with_each_step_logged_once(checkpoint_every, reference, tmp_path,
                                                         capsys):
    """Before its first checkpoint, or after one (the lost steps are done again)."""
    workdir = _crash_then_resume(tmp_path, crash_at=5, checkpoint_every=checkpoint_every)
    assert [r["step"] for r in records(workdir)][:2] == [1, 2]  # logged before the kill
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # as if killed in the middle of a line
    config = ph.tiny_config(checkpoint_every=checkpoint_every)
    pretrain.train(config, str(workdir), ph.synthetic_data(config))
    assert "dropped 1 unreadable line" in capsys.readouterr().err
    assert records(workdir) == reference
    assert sorted(event_steps(workdir)) == [1, 2, 3, 4, 5, 6]  # TensorBoard too


@pytest.mark.xdist_group("faults_reference")  # one worker runs `reference` once
def test_sigint_saves_and_the_run_resumes(reference, tmp_path):
    config = ph.tiny_config(checkpoint_every=100)
    data = ph.synthetic_data(config)
    train = data.train

    class Interrupted:
        def __init__(self, it):
            self.it = it

        def __next__(self):
            if self.it.step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            return next(self.it)

        def position(self):
            return self.it.position()

    data.train = lambda position: Interrupted(train(position))
    out = pretrain.train(config, str(tmp_path), data)
    assert out["preempted"] and out["step"] == 4
    pretrain.train(config, str(tmp_path), ph.synthetic_data(config))
    assert records(tmp_path) == reference


def test_a_run_keeps_its_newest_checkpoints_and_a_signal_asks_for_a_save(tmp_path):
    """train.keep_checkpoints bounds the disk a week-long run fills; SIGTERM and a first
    Ctrl-C ask the loop to save and stop, a second Ctrl-C interrupts at once."""
    saved = checkpoints.RunCheckpoints(str(tmp_path), keep=2)
    for step in range(1, 5):
        saved.save(step, params={"w": np.full(3, step, np.float32)}, opt_state={"m": np.zeros(2)},
                   progress={"step": np.int32(step)}, host={})
    saved.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "4"]

    before = signal.getsignal(signal.SIGINT)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signalled = checkpoints.RunCheckpoints(str(tmp_path), keep=2)
        try:
            assert not signalled.preemption_requested(5)
            os.kill(os.getpid(), signum)
            assert signalled.preemption_requested(5), signal.Signals(signum).name
            if signum == signal.SIGINT:
                with pytest.raises(KeyboardInterrupt):
                    os.kill(os.getpid(), signal.SIGINT)
        finally:
            signalled.close()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_full_disk_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    # A tiny run's checkpoint takes 550-600 KB (it varies with what compresses): room for about
    # three, so at least one completes before the disk fills, whatever the machine.
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2000k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip()}): needs root")
    try:
        config = ph.tiny_config(checkpoint_every=1, keep_checkpoints=100)
        config.train.num_steps = 200
        with pytest.raises(OSError, match=r"(No space left on device|small/checkpoints failed)"):
            pretrain.train(config, str(mount), ph.synthetic_data(config))
        # The newest complete checkpoint reads back and verifies.
        checkpoints.open_model(str(mount)).load_params()
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_failed_start_is_one_line(tmp_path, shard_dir, capsys):
    """Expected failures through the CLIs' error handling: `<tool>: error: <what>`."""
    def one_line(fn, tool="bertjax.main"):
        with pytest.raises(SystemExit) as stop:
            with cli.one_line_errors(tool):
                fn()
        message = str(stop.value.code)
        assert message.startswith(f"{tool}: error: ") and "\n" not in message, message
        return message

    config = ph.tiny_config()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert str(blocker) in one_line(lambda: pretrain.train(
        config, str(blocker / "run"), ph.synthetic_data(config)))
    config.data.shard_dir = str(tmp_path / "nowhere")
    assert "nowhere/manifest.json not found" in one_line(lambda: pretrain.input_data(config))
    config.data.shard_dir = shard_dir
    config.data.heldout_fraction = 0.01  # 12 documents: none held out
    config.train.evaluate, config.train.eval_every, config.train.eval_batches = True, 2, 1
    message = one_line(lambda: pretrain.train(config, str(tmp_path / "r"),
                                              pretrain.input_data(config)))
    assert "0 held-out documents" in message and not (tmp_path / "r" / "checkpoints").exists()
    assert "is a directory: give its files" in one_line(
        lambda: corpus_lib.Corpus(str(tmp_path)), "prepare")
    model = tiny_model_dir(str(tmp_path / "model"))
    (pathlib.Path(model) / "task.json").write_text('{"type": "classification"}')
    assert "fine-tuned task model" in one_line(
        lambda: inference.fill_mask(model, ["It was [MASK]."], 1), "bertjax.predict")


def test_missing_config_file_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bertjax.main", "--config=configs/nope.py",
                             f"--workdir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("bertjax.main: error: "), \
        result.stderr[-2000:]
    assert "configs/nope.py" in result.stderr.strip().splitlines()[-1]


def test_prepare_removes_what_a_killed_run_left(tmp_path, shard_dir):
    output = tmp_path / "out"
    stale = tmp_path / "out.tmp-deadbeef"
    stale.mkdir()
    (stale / "documents-00000-of-00002.tfrecord").write_bytes(b"half")
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"Doc {d}. It ends."}) + "\n"
                              for d in range(4)))
    preparation.prepare(corpus_lib.Corpus(str(source), "jsonl"), str(output),
                        tokenizer=shard_dir, quiet=True)
    assert not stale.exists() and (output / "manifest.json").exists()


def test_a_truncated_safetensors_file_is_named(tmp_path):
    from bertjax import convert
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 37}))
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a")
    with pytest.raises(ValueError, match=r"model.safetensors is not a readable safetensors "
                                         r"file"):
        convert.convert(str(tmp_path / "hf"), str(tmp_path / "out"), src="hf", dst="bertjax",
                        log=lambda _: None, warn=lambda _: None)


def test_a_fine_tuned_model_as_init_checkpoint_gives_its_encoder(tmp_path):
    from bertjax.models.heads import BertForSequenceClassification, init_params
    from bertjax.training import config_sections, finetune, sharding
    import flax.linen as nn
    import jax
    from finetune_helpers import TINY
    from benchmarks.task_data import wordpiece
    params = nn.unbox(init_params(BertForSequenceClassification(TINY, 3),
                                  jax.random.PRNGKey(1)))
    model = str(tmp_path / "fine-tuned" / "model")
    checkpoints.save_model(model, params, TINY, wordpiece())
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    bert = finetune.load_encoder(checkpoints.open_model(str(tmp_path / "fine-tuned")),
                                 TINY.num_hidden_layers, mesh, config_sections.DEFAULT_RULES)
    jax.tree.map(np.testing.assert_array_equal, bert, params["bert"])
