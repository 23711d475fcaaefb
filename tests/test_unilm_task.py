"""The one-stack seq2seq task (`unilm`): training rows that mask target tokens at the
configured rate and never the source, greedy generation that is exactly "append a [MASK],
predict it, repeat", a fine-tuning run whose exported model generates what its evaluation
did, the warm-started masked-LM head, and the named errors."""
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.models.heads import init_params
from bertjax.tasks import base as tasks
from bertjax.training import finetune
from bertjax.training.inference import TaskPredictor
from finetune_helpers import TINY, sentences, tiny_config, tiny_model_dir, write_tsv
from benchmarks.task_data import wordpiece


def _task(**settings):
    settings = {"type": "unilm", "text_columns": "source", "label_column": "target",
                **settings}
    return tasks.get("unilm")(tiny_config("unused", **settings).task)


def _pairs(count, start):
    """Source: an Austen sentence; target: its first three words."""
    return [(s, " ".join(s.split()[:3])) for s in sentences(count, start=start)]


class _Recorder:
    """Stands in for the model: keeps the rows it is given, returns zero logits."""

    def apply(self, variables, ids_BL, mask_BL, segments_BL, positions_BT, **kwargs):
        self.rows = (np.asarray(ids_BL), np.asarray(mask_BL), np.asarray(segments_BL))
        return np.zeros(positions_BT.shape + (3,), np.float32)


def test_training_rows_hold_the_target_masked_at_the_rate_and_the_source_untouched(tmp_path):
    task = _task(max_seq_length=24, max_target_length=12, target_mask_rate=0.7)
    tokenizer = wordpiece()
    path = write_tsv(str(tmp_path / "train.tsv"), _pairs(96, 0), ("source", "target"))
    arrays = task.featurize(task.read(path, labelled=True), tokenizer, None).arrays
    assert arrays["input_ids"].shape[1] == 24 + 12  # room for the target after the source
    # The features hold the source alone, as generation sees it.
    assert np.all(arrays["segment_ids"] == 0)
    source_length = arrays["input_mask"].sum(axis=1)

    recorder = _Recorder()
    batch = {k: jax.numpy.asarray(v) for k, v in arrays.items()}
    _, masked_BT = task.forward(recorder, {}, batch, deterministic=False,
                                rngs={"dropout": jax.random.PRNGKey(3)})
    ids, mask, segments = recorder.rows
    target = arrays["target_mask"].astype(bool)
    masked = np.asarray(masked_BT)
    assert not np.any(masked & ~target)
    assert abs(masked.sum() / target.sum() - 0.7) < 0.07, masked.sum() / target.sum()
    for b in range(len(ids)):
        n, t = source_length[b], int(target[b].sum())
        np.testing.assert_array_equal(ids[b, :n], arrays["input_ids"][b, :n])
        assert np.all(segments[b, :n] == 0) and np.all(segments[b, n:n + t] == 1)
        assert np.all(mask[b, :n + t] == 1) and np.all(mask[b, n + t:] == 0)
        shown, gold = ids[b, n:n + t], arrays["target_ids"][b, :t]
        np.testing.assert_array_equal(shown, np.where(masked[b, :t], tokenizer.mask_id, gold))
        assert gold[-1] == tokenizer.sep_id  # the model learns where to stop
    # The denominator is the expected number of masked tokens, fixed before the draw.
    assert float(task.normalizer(batch)) == pytest.approx(0.7 * target.sum())
    # Another step draws another mask.
    _, again = task.forward(recorder, {}, batch, deterministic=False,
                            rngs={"dropout": jax.random.PRNGKey(4)})
    assert np.any(np.asarray(again) != masked)


def test_greedy_generation_appends_a_mask_and_takes_its_argmax():
    task = _task(max_seq_length=16, max_target_length=7, num_beams=1)
    tokenizer = wordpiece()
    model = task.model(TINY, None)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(1)))
    examples = task.examples_from_texts(["Emma smiled.", "She was the youngest of two.",
                                         "Mr. Knightley came in."])
    arrays = task.featurize(examples, tokenizer, None).arrays
    generated = np.asarray(task.infer(model, params, arrays))
    assert generated.shape == (3, 7) and np.all(generated[:, 0] == tokenizer.cls_id)

    # The same, one whole forward pass per token, nothing cached.
    ids, mask, segments = (arrays[k].copy() for k in ("input_ids", "input_mask",
                                                      "segment_ids"))
    start = mask.sum(axis=1)
    rows = np.arange(3)
    done = np.zeros(3, bool)
    apply = jax.jit(model.apply)  # one program, not the model's hundreds of eager ops
    for k in range(1, 7):
        slot = start + k - 1
        ids[rows, slot], mask[rows, slot], segments[rows, slot] = tokenizer.mask_id, 1, 1
        logits = apply({"params": params}, ids, mask, segments, slot[:, None])
        chosen = np.asarray(logits[:, 0].argmax(-1))
        for b in np.flatnonzero(~done):
            assert generated[b, k] == chosen[b], (b, k)
        done |= chosen == tokenizer.sep_id
        ids[rows, slot] = chosen
    assert [task.text(row) for row in generated] == [
        r["prediction"] for r in task.evaluate(tasks.TaskSet("x", examples, None, False),
                                               generated, None)[1]]


def test_fine_tuning_scores_generations_and_the_exported_model_generates_the_same(
        tmp_path):
    data = {name: write_tsv(str(tmp_path / f"{name}.tsv"), rows, ("source", "target"))
            for name, rows in (("train", _pairs(32, 0)), ("dev", _pairs(8, 40)))}
    config = tiny_config(tiny_model_dir(str(tmp_path / "tiny")), type="unilm",
                         text_columns="source", label_column="target",
                         train_file=data["train"], eval_files=data["dev"],
                         max_target_length=12, num_beams=2, label_smoothing=0.1)
    workdir = tmp_path / "run"
    result = finetune.finetune(config, str(workdir), jax.devices()[:1])
    final = result["results"]["dev"]["final"]["metrics"]
    assert set(final) == {"bleu", "chrf", "rougeL"}
    records = [json.loads(l) for l in (workdir / "predictions/dev.jsonl").read_text()
               .splitlines()]
    assert len(records) == 8 and {"source", "target", "prediction"} <= set(records[0])
    kept = json.loads((workdir / "model/task.json").read_text())
    assert kept["type"] == "unilm" and kept["num_beams"] == 2
    # Evaluation generated from the source alone: the model, given only the sources,
    # generates the same (beam search over the one stack, its rows as the cache).
    predictor = TaskPredictor(str(workdir / "model"), command="generate")
    again = predictor.predict(predictor.task.examples_from_texts([r["source"] for r in records]))
    assert [r["prediction"] for r in again] == [r["prediction"] for r in records]


def test_warm_start_takes_the_masked_lm_head_and_errors_are_named():
    task = _task(max_target_length=12)
    fresh = nn.unbox(init_params(task.model(TINY, None), jax.random.PRNGKey(0)))
    assert task.warm_start(fresh, {}) is fresh
    pretrained = jax.tree.map(lambda x: x + 1, fresh["mlm"])
    assert task.warm_start(fresh, {"mlm": pretrained})["mlm"] is pretrained

    with pytest.raises(ValueError, match="task.tie_encoder_decoder: unilm is one stack"):
        _task(tie_encoder_decoder=True)
    with pytest.raises(ValueError, match="unilm has no decoder to start fresh"):
        _task(warm_start_decoder=False)
    with pytest.raises(ValueError, match=r"task.target_mask_rate 0.0: in \(0, 1\]"):
        _task(target_mask_rate=0.0)
    with pytest.raises(ValueError, match="task.max_seq_length \\+ task.max_target_length = 70 "
                                         "exceeds the model's max_position_embeddings 64"):
        _task(max_seq_length=40, max_target_length=30).model(TINY, None)
