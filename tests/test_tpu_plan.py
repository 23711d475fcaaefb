"""`bertjax.main --compile_only`: a run's steps compiled ahead of time for a real TPU slice
(libtpu describes the slice; XLA:TPU compiles here, on the CPU), with its memory per chip, and
a run that cannot fit refused in one line."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.training import plan as plan_lib
from finetune_helpers import classification_files, tiny_config, tiny_model_dir

pytestmark = pytest.mark.skipif(
    not plan_lib.importlib.util.find_spec("libtpu"),
    reason="libtpu (the test extra, Linux x86_64 only) is not installed")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The TPU programs take tens of seconds each to compile on two cores: one xdist worker runs
# them all, so the process-wide slice descriptions and the compiled tiny model are shared.
# This process compiled CPU programs with the suite's persistent cache on before the plan
# turned it off (JAX decides once per process), so it looks TPU programs up there, finds
# those of an earlier run and cannot load them without a TPU: a warning, then a compile.
pytestmark = [pytestmark, pytest.mark.xdist_group("tpu_plan"), pytest.mark.filterwarnings(
    "ignore:Error reading persistent compilation cache entry")]


def tiny_pretraining(**overrides):
    from configs import tiny
    config = tiny.get_config()
    config.model.vocab_size = 1000
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.mark.parametrize("name, topology, chips, hosts", [
    ("v4-8", "v4:2x2x1", 4, 1), ("v4-32", "v4:2x2x4", 16, 4), ("v4-64", "v4:2x4x4", 32, 8),
    ("v5litepod-4", "v5e:2x2", 4, 1), ("v5litepod-8", "v5e:2x4", 8, 1),
    ("v5litepod-16", "v5e:4x4", 16, 4), ("v5litepod-32", "v5e:4x8", 32, 8),
    ("v5p-8", "v5p:2x2x1", 4, 1), ("v6e-8", "v6e:2x4", 8, 1), ("v6e-256", "v6e:16x16", 256, 64),
    ("v5e:4x4", "v5e:4x4", 16, 4), ("v4:2x2x2", "v4:2x2x2", 8, 2),
])
def test_accelerator_types_are_the_slices_cloud_tpu_builds(name, topology, chips, hosts):
    tpu = plan_lib.parse_slice(name)
    assert (tpu.topology, tpu.chips) == (topology, chips)
    devices = plan_lib.slice_devices(tpu)
    assert len(devices) == chips  # one device per chip: megacore on v4 and v5p
    assert len({d.process_index for d in devices}) == hosts


@pytest.mark.parametrize("name", ["v4-6", "v5litepod-12", "v9-8", "v5e:4", "v4:2x2", "tpu"])
def test_a_slice_it_cannot_shape_is_one_clear_error(name):
    with pytest.raises(ValueError, match=f"--compile_only={name}"):
        plan_lib.parse_slice(name)


def test_tiny_pretraining_compiles_for_v5e_and_v4_and_a_doubled_batch_costs_more():
    # 64 rows a chip: activations, which grow with the batch, outweigh XLA's fixed buffers.
    config = tiny_pretraining(**{"train.global_batch_size": 256})
    # Each TPU compile costs tens of seconds here: the eval step is compiled once.
    v5e = plan_lib.compile_plan(config, "v5e:2x2")
    v4 = plan_lib.compile_plan(config, "v4:2x2x1", evaluation=False)
    doubled = plan_lib.compile_plan(config, "v5e:2x2", 2 * config.train.global_batch_size,
                                    evaluation=False)
    for plan, steps in ((v5e, ["train step", "eval step"]), (v4, ["train step"]),
                        (doubled, ["train step"])):
        assert [s.name for s in plan.steps] == steps
        assert plan.compute_dtype == jnp.bfloat16  # what a TPU run computes in, not the CPU's
        assert plan.fits
        for step in plan.steps:
            assert min(step.state_bytes, step.batch_bytes, step.flops) > 0
            assert step.total_bytes >= step.state_bytes + step.batch_bytes
        # The backward pass keeps activations; a tiny eval step may need none off-chip.
        assert plan.steps[0].temp_bytes > 0
    train, twice = v5e.steps[0], doubled.steps[0]
    assert twice.state_bytes == train.state_bytes
    assert twice.batch_bytes == 2 * train.batch_bytes
    assert twice.temp_bytes > train.temp_bytes
    assert twice.flops == pytest.approx(2 * train.flops, rel=0.05)
    # Parameters are replicated on the default data-parallel mesh: every chip holds them
    # all, in float32, with AdamW's two moments.
    params = sum(x.size for x in jax.tree.leaves(
        plan_lib.PROGRAMS["pretrain"](config, _mesh("v5e:2x2"), 1).steps.abstract_params))
    assert train.state_bytes == pytest.approx(3 * 4 * params, rel=0.01)
    table = plan_lib.table(v5e)
    assert "v5e:2x2" in table and "TPU v5 lite" in table and "fits" in table


def _mesh(name):
    from bertjax.training import sharding
    return sharding.make_mesh((-1, 1, 1), plan_lib.slice_devices(plan_lib.parse_slice(name)))


def test_the_batch_it_compiles_for_is_the_pipelines_batch(tmp_path):
    from bertjax.data import pretraining, shards
    from bertjax.training import pretrain
    docs = [[[10 + 50 * d + 7 * s + i for i in range(7)] for s in range(6)] for d in range(8)]
    shards.write_documents(str(tmp_path), docs, num_shards=2)
    vocab = pretraining.Vocab(size=500, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
    for per_row in (1, 2):
        config = tiny_pretraining(**{"data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
                                     "data.examples_per_row": per_row,
                                     "train.global_batch_size": 4})
        batch = next(pretraining.pretraining_dataset(
            str(tmp_path), vocab=vocab, max_seq_length=32, max_predictions_per_seq=5,
            global_batch_size=4, seed=0, shuffle_tokens=256, examples_per_row=per_row))
        spec = pretrain.batch_spec(config)
        assert set(spec) == set(batch)
        for name, array in batch.items():
            assert (spec[name].shape, spec[name].dtype) == (array.shape, array.dtype), name


def test_a_finetuning_config_compiles_for_a_v5e_slice(tmp_path):
    # One slice: the pretraining test covers v4's topology.
    model = tiny_model_dir(str(tmp_path / "model"))
    data = classification_files(str(tmp_path))
    config = tiny_config(model, train_file=data["train"], eval_files=data["dev"])
    plan = plan_lib.compile_plan(config, "v5e:2x2")
    assert plan.fits and [s.name for s in plan.steps] == ["train step", "eval step"]
    assert min(plan.steps[0].temp_bytes, plan.steps[0].flops) > 0
    assert not os.path.exists(tmp_path / "workdir")


def _main(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "bertjax.main", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_base_pretraining_at_seq_128_fits_a_v5e_slice_and_prints_its_table():
    # BERT-base phase 1 at batch 64 on 4 chips: 16 rows a chip, as batch 256 on a v5e-16.
    # Its train step alone; the tiny runs compile eval steps too. The layers scanned: XLA:TPU
    # compiles one layer, not twelve (83 s against 155 s here); the tiny runs compile the
    # per-layer encoder.
    result = _main("--config=configs/base.py", "--compile_only=v5litepod-4",
                   "--config.train.global_batch_size=64", "--config.train.evaluate=false",
                   "--config.model.scan_layers=true")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "v5litepod-4 (v5e:2x2): 4 chips (TPU v5 lite, 16 GiB HBM each), 1 host" in out
    assert "global batch 64, bfloat16 compute, float32 parameters" in out
    assert "train step" in out and "eval step" not in out and "fits:" in out
    # Nothing libtpu prints about the TPU this machine lacks reaches the console.
    assert "TPU_ACCELERATOR_TYPE" not in result.stderr


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_compiling(tmp_path):
    # BERT-large phase 2 with a batch no v5e slice of 4 chips holds: its batch alone.
    result = _main("--config=configs/large.py:phase2", "--compile_only=v5e:2x2",
                   "--config.train.global_batch_size=16777216", f"--workdir={tmp_path}/run")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax.main: error: ")
    assert "v5e:2x2" in lines[0] and "largest term is batch" in lines[0]
    assert not os.path.exists(tmp_path / "run")  # a plan writes nothing


def test_temporaries_that_cannot_fit_are_refused_with_an_accumulation_hint():
    config = tiny_pretraining(**{"train.global_batch_size": 1 << 17})
    plan = plan_lib.compile_plan(config, "v5e:2x2")
    assert not plan.fits
    message = plan_lib.refusal(plan, 1)
    assert "largest term is temporaries" in message
    assert "--config.optimizer.grad_accum_steps=" in message


def _stub_plan(batch, bytes_per_chip, hbm_gib=16):
    tpu = plan_lib.parse_slice("v5e:2x2")
    step = plan_lib.StepPlan("train step", 1.0, 1 << 30, batch, bytes_per_chip - (1 << 30)
                             - batch, bytes_per_chip, 1e9, compiled=bytes_per_chip
                             <= hbm_gib * plan_lib.GIB)
    return plan_lib.Plan(tpu, [], {"data": 4, "fsdp": 1, "tensor": 1}, batch, jnp.float32,
                         [step], "")


@pytest.mark.parametrize("first", [64, 4096, 100_000])
def test_largest_batch_search_brackets_the_limit_within_its_precision(first):
    # Memory that grows a little slower than the batch, as XLA's buffer reuse makes it.
    def memory(batch):
        return int((1 << 30) + 3.1e6 * batch ** 0.93)
    compiled = []

    def compile_at(batch):
        compiled.append(batch)
        return _stub_plan(batch, memory(batch))
    limit = max(b for b in range(4, 200_000, 4) if memory(b) <= 16 * plan_lib.GIB)
    best, misfit = plan_lib.largest_batch(None, "v5e:2x2", compile_at(first), granule=4,
                                          report=lambda _: None, compile_at=compile_at)
    assert best.fits and best.global_batch_size % 4 == 0
    assert best.global_batch_size <= limit < misfit
    assert misfit - best.global_batch_size <= max(4, 0.02 * best.global_batch_size)
    assert len(compiled) <= 1 + 1 + 5  # the config's batch, a second point, then the search
