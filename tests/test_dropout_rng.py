"""model.dropout_rng and model.dropout_mask_bits: the cheaper generators and the 16-bit masks
depend only on (seed, step, micro-batch), so a run resumed from a checkpoint (which keeps the
threefry key and the state) continues exactly; they draw other masks than Flax's threefry
default; 16-bit masks drop at the rate asked, independently per element; bad values are one
error each."""
import flax.linen as nn
import jax.numpy as jnp
import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pretrain_helpers as ph
from bertjax.models import dropout
from bertjax.models.dropout import COUNTER_HASH, HalfWordDropout
from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining
from bertjax.training import pretrain, pretrain_config, trainer


def _setup(impl: str, mask_bits: int = 32):
    config = ph.tiny_config()
    config.model.dropout_mask_bits = mask_bits
    model = BertForPreTraining(BertConfig.from_config(config.model, vocab_size=ph.VOCAB))
    batch = ph.synthetic_batch(0, 0, range(4), 13, 3, ph.VOCAB)
    ids = batch["input_ids"]
    # Jitted: one program (the same for every test here, so a compilation-cache hit after the
    # first), not the initialisers' hundreds of eager ops compiled one by one.
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), ids, ids, ids,
                                          batch["masked_lm_positions"])["params"])
    tx = optax.adamw(1e-3)
    step = jax.jit(trainer.make_train_step(pretrain.objective(model, nsp=True), tx,
                                           lambda s: 1e-3, grad_accum_steps=2,
                                           dropout_rng=impl))
    return step, batch, trainer.TrainState(np.int32(0), params, tx.init(params))


def _two_steps(step, batch, state, resume: bool):
    rng = jax.random.PRNGKey(1)
    state, _ = step(state, batch, rng)
    if resume:  # what a checkpoint restores: host copies of the state and the key
        state, rng = jax.device_get((state, rng))
    return jax.device_get(step(state, batch, rng))


@pytest.mark.parametrize("impl, mask_bits",
                         [("unsafe_rbg", 32), ("threefry", 16), ("counter_hash", 16)])
def test_cheaper_dropout_resumes_exactly_and_draws_other_masks(impl, mask_bits):
    step, batch, state = _setup(impl, mask_bits)
    straight_state, straight = _two_steps(step, batch, state, resume=False)
    resumed_state, resumed = _two_steps(step, batch, state, resume=True)
    assert straight == resumed
    for a, b in zip(jax.tree.leaves(straight_state), jax.tree.leaves(resumed_state)):
        np.testing.assert_array_equal(a, b)
    threefry = _two_steps(*_setup("threefry"), resume=False)[1]
    assert np.isfinite(straight["loss"]) and straight["loss"] != threefry["loss"]


def _counter_hash_key(words):
    return jax.random.wrap_key_data(jnp.asarray(words, jnp.uint32), impl=COUNTER_HASH)


@pytest.mark.parametrize("key", [jax.random.PRNGKey(3), _counter_hash_key([3, 4])],
                         ids=["threefry", "counter_hash"])
def test_16_bit_masks_drop_each_element_independently_at_the_rate(key):
    rate = 0.1
    x = jnp.ones((64, 127, 33))  # odd length along the split axis: the last word is cut
    out = np.asarray(HalfWordDropout(rate).apply({}, x, deterministic=False,
                                                 rngs={"dropout": key}))
    dropped = out == 0
    # Binomial standard deviation of the dropped fraction: 0.00047 here.
    assert abs(dropped.mean() - rate) < 0.002
    assert abs(out.mean() - 1.0) < 0.003  # kept values are scaled back to the input's mean
    assert set(np.unique(out)) == {0.0, np.float32(65536 / (65536 - round(rate * 65536)))}
    # A word's two halves feed positions i and i + 64 along the split axis: their drops are
    # independent (both dropped 1% of the time), as are neighbours.
    low, high = dropped[:, :63], dropped[:, 64:127]
    assert abs((low & high).mean() - rate**2) < 0.002
    assert abs((dropped[:, :, :-1] & dropped[:, :, 1:]).mean() - rate**2) < 0.002
    # Every position drops at the rate (no position is favoured by the split).
    per_position = dropped.mean(axis=(0, 2))
    assert np.abs(per_position - rate).max() < 5 * np.sqrt(rate * (1 - rate) / (64 * 33))
    again = HalfWordDropout(rate).apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(again, out)
    assert np.array_equal(HalfWordDropout(rate).apply({}, x, deterministic=True), x)


def test_counter_hash_bits_are_uniform_and_independent_across_keys():
    shape = (256, 1024)
    bits = np.asarray(jax.random.bits(_counter_hash_key([7, 11]), shape, jnp.uint32))
    # Each of the 32 bit planes is set half the time (standard deviation 0.001 here).
    planes = (bits[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    assert np.abs(planes.mean(axis=(0, 1)) - 0.5).max() < 0.005
    # Bytes are uniform: chi-square over 256 values, 255 degrees of freedom (p = 1e-4 at 345).
    counts = np.bincount((bits & 0xFF).ravel(), minlength=256)
    expected = bits.size / 256
    assert ((counts - expected) ** 2 / expected).sum() < 345
    # Keys whose first words differ by less than the array's size hash the same set of
    # indices in the first round; the second word still makes the masks independent, as it
    # does for keys split from one another.
    near = np.asarray(jax.random.bits(_counter_hash_key([7 ^ 1, 12]), shape, jnp.uint32))
    split = np.asarray(jax.random.bits(jax.random.split(_counter_hash_key([7, 11]))[1], shape,
                                       jnp.uint32))
    drop = bits < 2**32 * 0.1
    for other in (near, split):
        both = (drop & (other < 2**32 * 0.1)).mean()
        assert abs(both - 0.01) < 0.001
        # Not a reshuffle of the same words either: two independent arrays of 2^18 words
        # share about 2^36 / 2^32 = 16 values.
        assert len(np.intersect1d(bits, other)) < 64
    # Same key, same bits, also when each of 8 devices computes its own rows.
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    sharded = jax.jit(lambda key: jax.random.bits(key, shape, jnp.uint32),
                      out_shardings=NamedSharding(mesh, PartitionSpec("data")))
    np.testing.assert_array_equal(np.asarray(sharded(_counter_hash_key([7, 11]))), bits)


def test_counter_hash_numbers_the_leading_axes_apart_beyond_32_bit_indices(monkeypatch):
    # Arrays over 2^32 elements (BERT-large's attention mask at a global batch of 1,024) cannot
    # be allocated here; the same path is taken with the index limit lowered to 2^10.
    shape = (64, 32, 32)
    key = _counter_hash_key([5, 6])
    direct = np.asarray(jax.random.bits(key, shape, jnp.uint32))
    monkeypatch.setattr(dropout, "_INDEX_LIMIT", 2**10)
    numbered_apart = np.asarray(jax.random.bits(key, shape, jnp.uint32))
    # Indices wrapping at the limit would repeat one 1,024-word block 64 times.
    assert len(np.unique(numbered_apart)) > numbered_apart.size - 8
    assert abs((numbered_apart < 2**32 * 0.1).mean() - 0.1) < 0.005
    assert not np.array_equal(direct, numbered_apart)
    monkeypatch.setattr(dropout, "_INDEX_LIMIT", 2**4)
    with pytest.raises(ValueError, match=r"dropout mask of shape \(64, 32, 32\) is too large"):
        jax.random.bits(key, shape, jnp.uint32)


def test_unknown_dropout_mask_bits_is_one_clear_error():
    config = pretrain_config.defaults("tiny")
    config.model.dropout_mask_bits = 8
    with pytest.raises(ValueError, match="model.dropout_mask_bits 8: expected one of 32, 16"):
        pretrain_config.validate(config)


def test_unknown_dropout_rng_is_one_clear_error():
    config = pretrain_config.defaults("tiny")
    config.model.dropout_rng = "philox"
    with pytest.raises(ValueError, match="model.dropout_rng 'philox': expected one of "
                                         "threefry, rbg, unsafe_rbg, counter_hash"):
        pretrain_config.validate(config)
