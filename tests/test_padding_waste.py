"""Fine-tuning without padding waste changes no result: a batch cut to its bucket length,
or packed several examples to a row, gives every example the loss (and the batch the
gradients) the fully padded batch gives, and a bucketed run trains to the parameters of a
padded one."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.batching import bucket_length, pack_rows, trim
from bertjax.models.bert import Packing
from bertjax.models.heads import BertForSequenceClassification, BertForTokenClassification
from bertjax.tasks import base as tasks
from bertjax.tasks.classify import TextExample, classification_features
from bertjax.tasks.tagging import TaggedSentence, tag_vocab, tagging_features
from bertjax.training import finetune, trainer
from bertjax.training.inference import TaskPredictor
from finetune_helpers import TINY, classification_files, sentences, tiny_config, tiny_model_dir
from benchmarks.task_data import wordpiece

DETERMINISTIC = dataclasses.replace(TINY, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def features():
    examples = [TextExample(f"s{i}", text, label=str(len(text) % 2))
                for i, text in enumerate(sentences(12))]
    return classification_features(examples, wordpiece(), 64, tasks.get("classification")(
        None).label_vocab(examples)).arrays


def test_a_batch_is_cut_to_the_shortest_bucket_that_holds_its_longest_example(features):
    longest = int(features["input_mask"].sum(1).max())
    assert longest < 32
    assert bucket_length(features, (8, 32, 48)) == 32
    assert bucket_length(features, (8, longest)) == longest
    assert bucket_length(features, (8,)) == 64  # none holds it
    cut = trim(features, 32)
    assert cut["input_ids"].shape == (12, 32) and cut["label"].shape == (12,)
    np.testing.assert_array_equal(cut["input_mask"].sum(1), features["input_mask"].sum(1))


def test_bucketed_evaluation_gives_every_row_its_padded_outputs_in_order(features):
    """Evaluation batches go shortest first, cut to their bucket; positional outputs come back
    padded to the full length and every output in the rows' own order."""
    model, params = _model_and_params(features)
    calls = []

    @jax.jit
    def step(params, batch):
        sequence_BLD, _ = model.apply({"params": params}, *(batch[k] for k in tasks.INPUTS),
                                      method=lambda m, *a: m.bert(*a, deterministic=True))
        return {"per_position": sequence_BLD[..., 0] * batch["input_mask"],
                "per_row": model.apply({"params": params}, *(batch[k] for k in tasks.INPUTS)),
                "ten_wide": jnp.zeros((batch["input_ids"].shape[0], 10))}

    def counted(params, batch):
        calls.append(batch["input_ids"].shape)
        return step(params, batch)

    padded = trainer.batched_outputs(step, params, features, tasks.INPUTS, 5)
    bucketed = trainer.batched_outputs(counted, params, features, tasks.INPUTS, 5, dict,
                                       (10, 16, 32))
    for key in padded:
        assert bucketed[key].shape == padded[key].shape, key
        np.testing.assert_allclose(bucketed[key], padded[key], rtol=1e-5, atol=1e-5)
    # 12 rows, 3 batches of 5 (the last padded with a repeated row), each cut to its bucket;
    # the first to 10, and the ten-wide output was not taken for positions.
    lengths = np.sort(features["input_mask"].sum(1))
    cut_to = [bucket_length({"input_mask": np.ones((1, n))}, (10, 16, 32))
              for n in lengths[[4, 9, 11]]]
    assert cut_to[0] == 10
    assert [shape[1] for shape in calls if shape[1] != 64] == cut_to


def _model_and_params(features):
    model = BertForSequenceClassification(DETERMINISTIC, 2)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), *(
        jnp.asarray(features[k][:1]) for k in tasks.INPUTS))["params"])
    return model, params


def test_bucketed_batch_gives_the_padded_batch_per_example_losses(features):
    model, params = _model_and_params(features)

    @jax.jit
    def per_example(params, batch):
        logits_BC = model.apply({"params": params}, *(batch[k] for k in tasks.INPUTS))
        return optax.softmax_cross_entropy_with_integer_labels(logits_BC, batch["label"])

    cut = trim(features, bucket_length(features, (32, 48)))
    assert cut["input_ids"].shape[1] == 32
    np.testing.assert_allclose(per_example(params, cut), per_example(params, features),
                               rtol=1e-5, atol=1e-6)


def test_packed_rows_hold_each_example_as_it_was(features):
    packed = pack_rows(features, ("label",), max_per_row=4)
    lengths = features["input_mask"].sum(1)
    assert len(packed["input_ids"]) == -(-int(lengths.sum()) // 64) < len(lengths)
    assert sorted(packed["example_index"][packed["example_weights"] > 0]) == list(range(12))
    for r, slot in zip(*np.nonzero(packed["example_weights"])):
        i, start = packed["example_index"][r, slot], packed["cls_positions"][r, slot]
        span = slice(start, start + lengths[i])
        np.testing.assert_array_equal(packed["input_ids"][r, span],
                                      features["input_ids"][i, :lengths[i]])
        np.testing.assert_array_equal(packed["position_ids"][r, span], np.arange(lengths[i]))
        assert set(packed["example_ids"][r, span]) == {slot + 1}
        assert packed["label"][r, slot] == features["label"][i]


def test_the_model_reads_packed_rows_whole_or_not_at_all(features):
    packed = pack_rows(features, ("label",), max_per_row=4)
    assert Packing.from_batch(features) is None  # one example a row
    assert Packing.from_batch(packed).cls_positions.shape == packed["example_weights"].shape
    del packed["cls_positions"]
    with pytest.raises(ValueError, match=r"a packed batch lacks \['cls_positions'\]"):
        Packing.from_batch(packed)


def test_packed_batch_gives_the_unpacked_per_example_losses_and_gradients(features):
    model, params = _model_and_params(features)
    task = tasks.get("classification")(None)
    packed = pack_rows(features, ("label",), max_per_row=4)

    @jax.jit
    def per_example(params):
        logits_BC = model.apply({"params": params}, *(features[k] for k in tasks.INPUTS))
        logits_BEC = model.apply({"params": params}, *(packed[k] for k in tasks.INPUTS),
                                 packing=Packing.from_batch(packed))
        ce = optax.softmax_cross_entropy_with_integer_labels
        return ce(logits_BC, features["label"]), ce(logits_BEC, packed["label"])

    def mean_loss(params, batch, arrays):
        outputs = model.apply({"params": params}, *(arrays[k] for k in tasks.INPUTS),
                              packing=Packing.from_batch(arrays))
        return task.loss_sum(outputs, batch) / task.normalizer(batch)

    unpacked_loss, packed_loss = per_example(params)
    slots = packed["example_weights"] > 0
    np.testing.assert_allclose(np.asarray(packed_loss)[slots],
                               np.asarray(unpacked_loss)[packed["example_index"][slots]],
                               rtol=1e-5, atol=1e-6)
    grads = jax.jit(jax.grad(mean_loss), static_argnums=())
    unpacked_grads = grads(params, features, features)
    packed_grads = grads(params, packed, packed)
    for a, b in zip(jax.tree.leaves(packed_grads), jax.tree.leaves(unpacked_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def tagged():
    """Tagging features: -1 labels at [CLS], [SEP], padding and non-first word pieces."""
    examples = [TaggedSentence(f"s{i}", text.split(),
                               ["CAP" if w[0].isupper() else "LOW" for w in text.split()])
                for i, text in enumerate(sentences(12))]
    return tagging_features(examples, wordpiece(), 64, tag_vocab(examples)).arrays


def test_packed_tagging_rows_carry_each_token_label_and_give_its_loss_and_gradients(tagged):
    """Tagging packs too: labels move with their tokens (-1 on padding), and every labelled
    token gets the loss (the batch the mean loss and gradients) it gets unpacked."""
    packed = pack_rows(tagged, ("label_ids",), max_per_row=4)
    lengths = tagged["input_mask"].sum(1)
    assert len(packed["input_ids"]) < len(lengths)
    assert packed["label_ids"].shape == packed["input_ids"].shape
    assert (packed["label_ids"][packed["input_mask"] == 0] == -1).all()
    for r, slot in zip(*np.nonzero(packed["example_weights"])):
        i, start = packed["example_index"][r, slot], packed["cls_positions"][r, slot]
        np.testing.assert_array_equal(packed["label_ids"][r, start:start + lengths[i]],
                                      tagged["label_ids"][i, :lengths[i]])
    assert (packed["label_ids"] >= 0).sum() == (tagged["label_ids"] >= 0).sum()

    model = BertForTokenClassification(DETERMINISTIC, 2)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), *(
        jnp.asarray(tagged[k][:1]) for k in tasks.INPUTS))["params"])
    task = tasks.get("tagging")(tasks.get("tagging").settings())

    def logits(params, arrays):
        return model.apply({"params": params}, *(arrays[k] for k in tasks.INPUTS),
                           packing=Packing.from_batch(arrays))

    def token_losses(arrays):
        ce = optax.softmax_cross_entropy_with_integer_labels(
            logits(params, arrays), np.maximum(arrays["label_ids"], 0))
        return np.asarray(ce)[arrays["label_ids"] >= 0]

    def by_example(arrays, rows_and_starts):
        """Each example's labelled-token losses, in example order."""
        ce = optax.softmax_cross_entropy_with_integer_labels(
            logits(params, arrays), np.maximum(arrays["label_ids"], 0))
        out = []
        for r, start, n in rows_and_starts:
            labelled = arrays["label_ids"][r, start:start + n] >= 0
            out.append(np.asarray(ce)[r, start:start + n][labelled])
        return np.concatenate(out)

    order = sorted(zip(*np.nonzero(packed["example_weights"])),
                   key=lambda rs: packed["example_index"][rs])
    packed_losses = by_example(packed, [(r, packed["cls_positions"][r, s],
                                         lengths[packed["example_index"][r, s]])
                                        for r, s in order])
    np.testing.assert_allclose(packed_losses, token_losses(tagged), rtol=1e-5, atol=1e-6)

    def mean_loss(params, arrays):
        return task.loss_sum(logits(params, arrays), arrays) / task.normalizer(arrays)
    grads = jax.jit(jax.grad(mean_loss))
    for a, b in zip(jax.tree.leaves(grads(params, packed)),
                    jax.tree.leaves(grads(params, tagged))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bucketed_run_trains_to_the_padded_run_parameters_and_packed_runs_train(tmp_path):
    data = classification_files(str(tmp_path))
    model_dir = tiny_model_dir(str(tmp_path / "model"))
    runs = {}
    for name, buckets, per_row in (("padded", (), 1), ("bucketed", (8, 12), 1),
                                   ("packed", (8, 12), 4)):
        config = tiny_config(model_dir, train_file=data["train"], eval_files=data["dev"])
        config.model.hidden_dropout_prob = config.model.attention_probs_dropout_prob = 0.0
        config.train.num_epochs = 1.0
        config.train.bucket_lengths = buckets
        config.train.examples_per_row = per_row
        runs[name] = finetune.finetune(config, str(tmp_path / name), jax.devices()[:1])
    for a, b in zip(jax.tree.leaves(runs["padded"]["params"]),
                    jax.tree.leaves(runs["bucketed"]["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert (runs["padded"]["results"]["dev"]["final"]["metrics"]
            == pytest.approx(runs["bucketed"]["results"]["dev"]["final"]["metrics"]))
    # 64 sentences of 5 to 20 tokens fill fewer rows of 16: fewer steps for the same epoch,
    # evaluated example by example as before (the buckets cut evaluation batches only).
    assert runs["packed"]["step"] < runs["padded"]["step"] == 4
    assert len((tmp_path / "packed/predictions/dev.jsonl").read_text().splitlines()) == 20


def test_a_packed_tagging_run_trains_and_tags_every_held_out_word(tmp_path):
    texts = sentences(60)
    function_words = {"the", "of", "and", "to", "a", "her", "was", "in", "it", "she", "i"}

    def tag(word):
        return "FN" if word.lower() in function_words else "W"
    conll = tmp_path / "train.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {tag(w)}" for w in t.split())
                                  for t in texts) + "\n")
    config = tiny_config(tiny_model_dir(str(tmp_path / "model")), type="tagging",
                         train_file=str(conll), eval_files=str(conll))
    config.task.max_seq_length = 64
    config.train.examples_per_row = 4
    config.train.bucket_lengths = (16, 32)  # evaluation batches; packed rows are full
    config.train.global_batch_size = 4
    config.optimizer.learning_rate = 3e-3
    config.train.num_epochs = 8.0
    run = finetune.finetune(config, str(tmp_path / "run"), jax.devices()[:1])
    # 60 sentences in fewer rows of 64: fewer steps than the unpacked 15 an epoch.
    assert run["step"] < 8 * 15
    metrics = run["results"]["train"]["final"]["metrics"]
    # A tagger that learnt anything beats tagging every word with the majority tag.
    tags = [tag(w) for t in texts for w in t.split()]
    majority = max(tags.count("FN"), tags.count("W")) / len(tags)
    assert metrics["token_accuracy"] > majority + 0.1, (metrics, majority)
    predictions = (tmp_path / "run/predictions/train.jsonl").read_text().splitlines()
    assert len(predictions) == 60


def test_prediction_cuts_its_batches_and_predicts_what_padded_batches_predict(tmp_path):
    """`predict` sorts its rows by length and cuts each batch to a bucket below the model's
    max_seq_length; every word gets the tag it gets from fully padded batches."""
    texts = sentences(60)
    conll = tmp_path / "train.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {'CAP' if w[0].isupper() else 'LOW'}"
                                           for w in t.split()) for t in texts) + "\n")
    config = tiny_config(tiny_model_dir(str(tmp_path / "model")), type="tagging",
                         train_file=str(conll))
    config.task.max_seq_length = 64
    config.train.num_epochs = 1.0
    finetune.finetune(config, str(tmp_path / "run"), jax.devices()[:1])

    padded = TaskPredictor(str(tmp_path / "run"), bucket_lengths=())
    bucketed = TaskPredictor(str(tmp_path / "run"))
    lengths, apply = [], bucketed._apply

    def counted(params, batch):
        if not isinstance(batch["input_ids"], jax.core.Tracer):  # not the output-shape probe
            lengths.append(batch["input_ids"].shape[1])
        return apply(params, batch)
    bucketed._apply = counted
    examples = padded.examples_from_file(str(conll))
    assert bucketed.predict(examples) == padded.predict(examples)
    assert 16 in lengths and max(lengths) < 64, lengths


def test_bucket_lengths_are_checked(tmp_path):
    config = tiny_config(str(tmp_path), train_file="x.tsv")
    config.train.bucket_lengths = (12, 8)
    with pytest.raises(ValueError, match=r"train.bucket_lengths \(12, 8\): expected ascending "
                                         r"distinct lengths from 1 to task.max_seq_length 16"):
        finetune.finetune(config, str(tmp_path / "a"))
    config = tiny_config(str(tmp_path), type="squad", train_file="x.json")
    config.train.bucket_lengths = (8,)
    with pytest.raises(ValueError, match="task.type squad cannot cut its batches: its span "
                                         "softmax runs over every position"):
        finetune.finetune(config, str(tmp_path / "b"))
    config.train.bucket_lengths = ()
    config.train.examples_per_row = 2
    with pytest.raises(ValueError, match="task.type squad cannot hold several examples in a "
                                         "row"):
        finetune.finetune(config, str(tmp_path / "c"))
