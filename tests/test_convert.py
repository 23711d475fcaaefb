"""Conversion of Hugging Face checkpoints with heads, in every layout users have on disk, and
the errors a bad checkpoint gets. A small random BERT with odd sizes stands in for a real one."""

import functools
import os
import shutil
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from safetensors.numpy import load_file, save_file

from bertjax import convert
from bertjax.convert import params as cparams
from bertjax.convert.result import Converted
from bertjax.models.bert import BertConfig, BertModel
from bertjax.models.heads import BertForPreTraining

HF_CONFIG = dict(vocab_size=99, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=37, max_position_embeddings=16, type_vocab_size=2)
QUIET = dict(log=lambda _: None)


@pytest.fixture(scope="module")
def hf_model():
    """A BertForPreTraining with every weight random (LayerNorms and biases included), so a
    swapped or mis-transposed tensor cannot go unnoticed."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**HF_CONFIG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.tie_weights()
    return model


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
    """The model saved by `save_pretrained` (safetensors, `bert.` prefix)."""
    path = str(tmp_path_factory.mktemp("hf") / "st")
    hf_model.save_pretrained(path)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                          + [f"w{i}" for i in range(94)]) + "\n")
    return path


def variant(hf_dir, tmp_path, edit):
    """A copy of `hf_dir` whose safetensors dict went through `edit(tensors) -> tensors`."""
    out = str(tmp_path / "variant")
    shutil.copytree(hf_dir, out)
    path = os.path.join(out, "model.safetensors")
    save_file(edit(load_file(path)), path, metadata={"format": "pt"})
    return out


def old_style(tensors):
    """No `bert.` prefix and gamma/beta LayerNorm names, as in early pytorch-pretrained-bert."""
    renamed = {}
    for key, value in tensors.items():
        key = key.removeprefix("bert.")
        if "LayerNorm" in key:
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        renamed[key] = value
    renamed["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    return renamed


def batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, HF_CONFIG["vocab_size"], (3, 11)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 4:] = 0
    segs = np.zeros_like(ids)
    segs[1, 6:] = 1
    positions = np.array([[1, 2, 6], [3, 8, 10], [0, 1, 3]], np.int32)
    return ids, mask, segs, positions


@functools.partial(jax.jit, static_argnums=0)
def forward(config, params, ids, mask, segs, positions):
    seq, pooled = BertModel(config).apply({"params": params["bert"]}, ids, mask, segs)
    heads = BertForPreTraining(config).apply({"params": params}, ids, mask, segs, positions)
    return seq, pooled, heads


def compare(converted, hf_model):
    """max |bertjax - transformers| of hidden states, pooled output, MLM and NSP logits."""
    ids, mask, segs, positions = batch()
    seq, pooled, heads = forward(converted.config, converted.params, ids, mask, segs, positions)
    inputs = dict(input_ids=torch.tensor(ids, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long),
                  token_type_ids=torch.tensor(segs, dtype=torch.long))
    with torch.no_grad():
        ref = hf_model(**inputs, output_hidden_states=True)
        ref_pooled = hf_model.bert(**inputs).pooler_output.numpy()
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[:, :, None], axis=1)
    real = mask.astype(bool)
    return {"hidden": np.abs(np.asarray(seq) - ref.hidden_states[-1].numpy())[real].max(),
            "pooled": np.abs(np.asarray(pooled) - ref_pooled).max(),
            "mlm": np.abs(np.asarray(heads["mlm_logits"]) - ref_mlm).max(),
            "nsp": np.abs(np.asarray(heads["nsp_logits"])
                          - ref.seq_relationship_logits.numpy()).max()}


@pytest.mark.parametrize("layout", ["safetensors", "pytorch_model.bin", "old names, no prefix"])
def test_heads_match_transformers(layout, hf_model, hf_dir, tmp_path):
    if layout == "pytorch_model.bin":
        path = str(tmp_path / "bin")
        hf_model.save_pretrained(path, safe_serialization=False)
        shutil.copy(os.path.join(hf_dir, "vocab.txt"), path)
        assert os.listdir(path).count("pytorch_model.bin") == 1
    elif layout == "old names, no prefix":
        path = variant(hf_dir, tmp_path, old_style)
    else:
        path = hf_dir
    converted = convert.read("hf", path, **QUIET)
    assert converted.fresh == []
    assert [os.path.basename(p) for p in converted.tokenizer_files] == ["vocab.txt"]
    diffs = compare(converted, hf_model)
    assert all(d <= 1e-4 for d in diffs.values()), diffs
    assert np.abs(np.asarray(converted.params["mlm"]["output_bias"])).max() > 0.1


def test_missing_heads_initialised_as_a_fresh_model_would_be(hf_dir, tmp_path):
    encoder_only = variant(hf_dir, tmp_path, lambda t: {k: v for k, v in t.items()
                                                         if not k.startswith("cls.")})
    converted = convert.read("hf", encoder_only, seed=3, **QUIET)
    heads = {"mlm/transform/kernel", "mlm/transform/bias", "mlm/layer_norm/scale",
             "mlm/layer_norm/bias", "mlm/output_bias", "nsp/kernel", "nsp/bias"}
    assert set(converted.fresh) == heads
    config = converted.config
    init = jax.jit(BertForPreTraining(config).init)
    fresh_model = init(jax.random.PRNGKey(3), *batch())["params"]
    expected, got = cparams.flatten(nn.unbox(fresh_model)), cparams.flatten(converted.params)
    for path in heads:
        np.testing.assert_array_equal(got[path], expected[path], err_msg=path)


def error_for(hf_dir, tmp_path, edit):
    with pytest.raises(ValueError) as info:
        convert.read("hf", variant(hf_dir, tmp_path, edit), **QUIET)
    return str(info.value)


def test_wrong_shape_names_the_tensor_and_both_shapes(hf_dir, tmp_path):
    key = "bert.encoder.layer.1.attention.self.key.weight"
    message = error_for(hf_dir, tmp_path, lambda t: {**t, key: t[key][:, :35]})
    assert key in message and "(36, 35)" in message and "(36, 36)" in message


def test_missing_tensor_is_named(hf_dir, tmp_path):
    key = "bert.encoder.layer.0.intermediate.dense.bias"
    message = error_for(hf_dir, tmp_path, lambda t: {k: v for k, v in t.items() if k != key})
    assert "missing" in message and key in message


def test_partly_missing_head_is_an_error_not_a_fresh_init(hf_dir, tmp_path):
    key = "cls.seq_relationship.bias"
    message = error_for(hf_dir, tmp_path, lambda t: {k: v for k, v in t.items() if k != key})
    assert "missing" in message and key in message


def test_unexpected_tensor_is_named(hf_dir, tmp_path):
    # A layer more than the config says is never a head to skip: the config is wrong.
    extra = "bert.encoder.layer.2.output.dense.bias"
    message = error_for(hf_dir, tmp_path / "layer",
                        lambda t: {**t, extra: np.zeros(36, np.float32)})
    assert "unexpected tensors in the encoder" in message and extra in message
    # A task head is skipped, unless strict.
    path = variant(hf_dir, tmp_path / "head", lambda t: {**t, "classifier.weight":
                                                         np.zeros((3, 36), np.float32)})
    assert convert.read("hf", path, **QUIET).skipped == ["classifier.weight"]
    with pytest.raises(ValueError, match=r"unexpected tensors .*--strict.*classifier\.weight"):
        convert.read("hf", path, strict=True, **QUIET)


TASK_HEADS = {f"cls.{name}.{kind}": shape
              for name, n in (("sentiment", 2), ("topic", 5), ("toxicity", 1))
              for kind, shape in (("weight", (n, 36)), ("bias", (n,)))}


@pytest.mark.parametrize("layout", ["pytorch_model.bin", "safetensors"])
def test_checkpoint_with_extra_heads_converts_encoder_and_mlm_head(layout, tmp_path):
    """A published-style BertForMaskedLM (bert. prefix, tied MLM head) that also carries three
    task heads: the encoder and MLM head convert, the heads are listed and left out."""
    torch.manual_seed(1)
    model = transformers.BertForMaskedLM(transformers.BertConfig(**HF_CONFIG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.tie_weights()
    path = str(tmp_path / "with_heads")
    model.save_pretrained(path, safe_serialization=layout == "safetensors")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.update({k: torch.randn(shape) for k, shape in TASK_HEADS.items()})
    if layout == "safetensors":
        save_file({k: v.numpy() for k, v in state.items()},
                  os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(path, "pytorch_model.bin"))

    warnings = []
    converted = convert.convert(path, str(tmp_path / "out"), src="hf", warn=warnings.append,
                                **QUIET)
    assert converted.skipped == sorted(TASK_HEADS)
    assert any(all(k in w for k in TASK_HEADS) for w in warnings), warnings
    # BertForMaskedLM has no pooler and no NSP head: those start fresh, and say so.
    assert {p.split("/")[0] + "/" + p.split("/")[1] for p in converted.fresh} == {
        "bert/pooler", "nsp/kernel", "nsp/bias"}
    back = convert.read("bertjax", str(tmp_path / "out"))
    ids, mask, segs, positions = batch()
    seq, _, heads = forward(back.config, back.params, ids, mask, segs, positions)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    token_type_ids=torch.tensor(segs, dtype=torch.long),
                    output_hidden_states=True)
    real = mask.astype(bool)
    assert np.abs(np.asarray(seq) - ref.hidden_states[-1].numpy())[real].max() < 1e-4
    ref_mlm = np.take_along_axis(ref.logits.numpy(), positions[:, :, None], axis=1)
    assert np.abs(np.asarray(heads["mlm_logits"]) - ref_mlm).max() < 1e-4


def test_strict_cli_refuses_extra_heads_in_one_line(hf_dir, tmp_path):
    import subprocess
    path = variant(hf_dir, tmp_path, lambda t: {
        **t, **{k: np.zeros(shape, np.float32) for k, shape in TASK_HEADS.items()}})
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    out = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, "-m", "bertjax.convert", "--from=hf", "--strict",
                           f"--input={path}", f"--output={out}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("bertjax.convert: error:") and all(k in error for k in TASK_HEADS)
    assert not os.path.exists(out)


def test_untied_decoder_is_an_error(hf_dir, tmp_path):
    def untie(t):
        return {**t, "cls.predictions.decoder.weight":
                t["bert.embeddings.word_embeddings.weight"] + 1.0}
    assert "cls.predictions.decoder.weight" in error_for(hf_dir, tmp_path, untie)


def test_bin_without_torch_says_torch_is_needed(hf_model, tmp_path, monkeypatch):
    path = str(tmp_path / "bin")
    hf_model.save_pretrained(path, safe_serialization=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="pytorch_model.bin needs PyTorch"):
        convert.read("hf", path, **QUIET)


def test_other_architectures_are_refused(hf_dir, tmp_path):
    path = str(tmp_path / "roberta")
    shutil.copytree(hf_dir, path)
    config = os.path.join(path, "config.json")
    with open(config) as f:
        text = f.read().replace('"model_type": "bert"', '"model_type": "roberta"')
    with open(config, "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        convert.read("hf", path, **QUIET)


def test_tf_optimizer_slots_ignored_and_values_recovered(hf_dir, tmp_path):
    converted = convert.read("hf", hf_dir, **QUIET)
    tf_dir = str(tmp_path / "tf")
    convert.write("tf", tf_dir, converted, **QUIET)
    # Add what a `run_pretraining.py` checkpoint holds besides the weights.
    reader = tf.train.load_checkpoint(tf_dir)
    names = sorted(reader.get_variable_to_shape_map())
    tensors = {n: reader.get_tensor(n) for n in names}
    extra = {f"{n}/adam_m": np.zeros_like(v) for n, v in tensors.items()}
    extra["global_step"] = np.array(1000, np.int64)
    full = {**tensors, **extra}
    prefix = os.path.join(tf_dir, "bert_model.ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(full), shape_and_slices=[""] * len(full),
                      tensors=list(full.values()))
    # The heads in the original layout, checked against the Hugging Face file directly.
    hf = load_file(os.path.join(hf_dir, "model.safetensors"))
    for tf_name, hf_name, transposed in [
            ("cls/predictions/transform/dense/kernel", "cls.predictions.transform.dense.weight",
             True),
            ("cls/predictions/transform/LayerNorm/gamma",
             "cls.predictions.transform.LayerNorm.weight", False),
            ("cls/predictions/output_bias", "cls.predictions.bias", False),
            ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight", False),
            ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias", False),
            ("bert/pooler/dense/kernel", "bert.pooler.dense.weight", True)]:
        want = hf[hf_name].T if transposed else hf[hf_name]
        np.testing.assert_array_equal(tensors[tf_name], want, err_msg=tf_name)
    back = convert.read("tf", prefix, **QUIET)
    want, got = cparams.flatten(converted.params), cparams.flatten(back.params)
    assert want.keys() == got.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)


def test_pre_layer_norm_models_cannot_be_exported(tmp_path):
    config = BertConfig(**HF_CONFIG, pre_layer_norm=True)
    with pytest.raises(ValueError, match="pre_layer_norm"):
        convert.write("hf", str(tmp_path / "x"), Converted(config, {}, [], []), **QUIET)
    assert not os.path.exists(tmp_path / "x")


def test_existing_output_is_not_replaced(hf_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FileExistsError, match="overwrite"):
        convert.convert(hf_dir, str(out), src="hf", **QUIET)
