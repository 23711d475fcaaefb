"""`python -m bertjax.main`: configs, config errors, the multi-host contract (two processes
on localhost, preempted and resumed, train exactly like one)."""

import functools
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import pretrain_helpers as ph
from bertjax import main
from bertjax.training import pretrain, pretrain_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flat_keys(config, prefix=""):
    keys = set()
    for k, v in config.items():
        keys |= flat_keys(v, f"{prefix}{k}.") if hasattr(v, "items") else {prefix + k}
    return keys


def load(spec):
    path, _, arg = spec.partition(":")
    spec = importlib.util.spec_from_file_location("config", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.get_config(*([arg] if arg else []))


@pytest.mark.parametrize("name", ["tiny", "base", "large"])
def test_configs_have_every_key_and_say_how_to_run_them(name):
    module, config = load(f"configs/{name}.py")
    assert flat_keys(config) == flat_keys(pretrain_config.defaults())
    assert re.search(rf"python -m bertjax.main --config=configs/{name}\.py(:\w+)? --workdir=",
                     module.__doc__)


def test_tiny_context_recipe_is_the_quick_one_past_the_plateau():
    """`make demo` runs configs/tiny.py:context: the recipe that, at this size, gets past the
    context-free plateau; only the keys that recipe names differ from the default."""
    _, quick = load("configs/tiny.py")
    _, context = load("configs/tiny.py:context")
    def value(config, key):
        return functools.reduce(getattr, key.split("."), config)
    changed = {k for k in flat_keys(quick) if value(quick, k) != value(context, k)}
    assert changed == {
        "data.max_seq_length", "data.max_predictions_per_seq", "data.nsp",
        "model.pre_layer_norm", "model.hidden_dropout_prob",
        "model.attention_probs_dropout_prob", "optimizer.learning_rate",
        "optimizer.warmup_steps", "train.num_steps", "train.log_every", "train.eval_every",
        "train.checkpoint_every"}
    assert (context.data.nsp, context.model.pre_layer_norm, context.train.num_steps) == (
        False, True, 4500)
    assert quick.data.nsp and not quick.model.pre_layer_norm  # the original objective
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert "--config=configs/tiny.py:context" in f.read()
    with pytest.raises(ValueError, match="recipe 'fast': expected one of quick, context"):
        load("configs/tiny.py:fast")


def test_base_and_large_follow_the_two_phase_recipe():
    for name in ("base", "large"):
        _, one = load(f"configs/{name}.py")
        _, two = load(f"configs/{name}.py:phase2")
        assert (one.data.max_seq_length, one.data.max_predictions_per_seq) == (128, 20)
        assert (two.data.max_seq_length, two.data.max_predictions_per_seq) == (512, 80)
        assert one.train.num_steps == 9 * two.train.num_steps  # 90% / 10%
        assert (one.optimizer.name, one.optimizer.learning_rate, one.optimizer.eps,
                one.optimizer.weight_decay, one.optimizer.warmup_steps,
                one.optimizer.clip_norm) == ("bert_adamw", 1e-4, 1e-6, 0.01, 10_000, 1.0)
    with pytest.raises(ValueError, match="phase 'phase3': expected one of phase1, phase2"):
        load("configs/base.py:phase3")


def run_main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bertjax.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


def test_unknown_config_key_is_one_clear_line(tmp_path):
    done = run_main("--config=configs/tiny.py", f"--workdir={tmp_path}",
                    "--config.train.num_step=10")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "bertjax.main: error: --config.train.num_step: train has no key 'num_step' (every key "
        "must exist in the config file); did you mean num_steps?")
    assert "Traceback" not in done.stderr


def test_unknown_mode_and_bad_distributed_environment_are_named(monkeypatch):
    config = pretrain_config.defaults()
    config.mode = "pretrian"
    with pytest.raises(ValueError, match="config.mode 'pretrian': expected one of pretrain"):
        main.run_mode(config, "/unused")
    monkeypatch.setenv("BERTJAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("BERTJAX_PROCESS_ID", "2")
    monkeypatch.setenv("BERTJAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    with pytest.raises(ValueError, match="0 <= BERTJAX_PROCESS_ID < 2; got .*BERTJAX_PROCESS_ID=2"):
        main.initialize_distributed()
    monkeypatch.setenv("BERTJAX_PROCESS_ID", "one")
    with pytest.raises(ValueError, match="BERTJAX_PROCESS_ID='one': expected an integer"):
        main.initialize_distributed()


GLOO_MISSED = "Gloo context initialization failed"


class GlooRendezvousMissed(Exception):
    """The two processes did not reach a collective within gloo's fixed timeout."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [(r["step"], r.get("loss"), r.get("eval_mlm_loss"))
                for r in map(json.loads, f)]


def run_two_processes(workdir, *args):
    port = free_port()
    workers = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "multiprocess_driver.py"), str(workdir),
         *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT}/tests", "JAX_PLATFORMS": "cpu",
             "JAX_NUM_CPU_DEVICES": "2", "BERTJAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
             "BERTJAX_NUM_PROCESSES": "2", "BERTJAX_PROCESS_ID": str(i)})
        for i in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    if any(GLOO_MISSED in o for o in outputs):
        raise GlooRendezvousMissed(outputs[0][-2000:])
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return [o.strip().splitlines()[-1] for o in outputs]


def preempted_then_resumed_on_two_processes(workdir):
    # Both hosts get SIGTERM at step 3; JAX's preemption sync makes them save the same step.
    stops = run_two_processes(workdir, "3")
    assert stops[0] == stops[1] and stops[0].endswith("preempted: True"), stops
    stopped = int(stops[0].split()[3].rstrip(","))
    saved = sorted(int(s) for s in os.listdir(workdir / "checkpoints"))
    assert 3 <= stopped < 6 and saved[-1] == stopped, (stops, saved)
    assert run_two_processes(workdir) == ["stopped at step 6, preempted: False"] * 2


def test_two_processes_preempted_and_resumed_train_exactly_like_one(tmp_path):
    try:
        preempted_then_resumed_on_two_processes(tmp_path / "two")
    except GlooRendezvousMissed:
        # Gloo gives the processes a fixed 30 s to meet at each new collective; on a loaded
        # 2-core machine one compiling process can miss it. That is the test machine, not
        # bertjax: play the whole story once more from a fresh workdir.
        shutil.rmtree(tmp_path / "two")
        preempted_then_resumed_on_two_processes(tmp_path / "two")

    # One process, all 8 devices: only the order of reductions differs (as between meshes).
    config = ph.multiprocess_config(mesh_shape=(8, 1, 1))
    pretrain.train(config, str(tmp_path / "one"), ph.synthetic_data(config))
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [s for s, _, _ in two] == [1, 2, 3, 3, 4, 5, 6, 6]  # train and eval records
    np.testing.assert_allclose(np.array([r[1:] for r in two], float),
                               np.array([r[1:] for r in one], float), rtol=2e-6)
    # Both processes wrote their shards of each checkpoint; the exported model is complete.
    assert sorted(os.listdir(tmp_path / "two" / "checkpoints"))[-1] == "6"
    assert os.path.exists(tmp_path / "two" / "model" / "config.json")


def test_compute_is_bfloat16_on_accelerators_and_float32_on_cpu(monkeypatch):
    import jax.numpy as jnp
    from bertjax.models.bert import compute_dtype
    assert compute_dtype("auto") == jnp.float32  # these tests run on the CPU
    for backend in ("gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert compute_dtype("auto") == jnp.bfloat16
    assert compute_dtype("float32") == jnp.float32


@pytest.mark.parametrize("kind, peak", [("TPU v5 lite", 197e12), ("TPU v5p", 459e12),
                                        ("TPU v6 lite", 918e12), ("TPU7x", 2307e12),
                                        ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H200", 989e12), ("NVIDIA B200", 2250e12),
                                        ("NVIDIA A100-SXM4-80GB", 312e12)])
def test_mfu_counts_against_the_chips_datasheet_peak(kind, peak):
    from types import SimpleNamespace
    from bertjax.training import metrics
    devices = [SimpleNamespace(device_kind=kind)] * 4
    assert metrics.peak_flops(devices) == 4 * peak
    assert metrics.peak_flops(devices, per_device=1e12) == 4e12  # the config overrides it
