"""Fingerprints (training/integrity.py) are computed in NumPy where the arrays are in this
process's memory and by a jitted reduction elsewhere; checkpoints written one way are verified
the other way (a run moved between a CPU and an accelerator), so both must agree on every
dtype and sharding, and both must notice one changed word."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.training import integrity


def _tree():
    rng = np.random.default_rng(0)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    return {
        # Past integrity._COLUMNS words, and an exact multiple of it: the host sum's rows.
        "f32": jnp.asarray(rng.normal(size=(130, 97)), jnp.float32),
        "rows": jnp.asarray(rng.normal(size=(2, 4096)), jnp.float32),
        "bf16": jnp.asarray(rng.normal(size=(70, 150)), jnp.bfloat16),
        "int32": jnp.arange(-5, 100, dtype=jnp.int32),
        "uint8": jnp.arange(300, dtype=jnp.uint8),
        "bool": jnp.array([True, False, True]),
        "step": jnp.int32(41),
        "nan": jnp.array([1.0, np.nan], jnp.float32),
        "inf": jnp.zeros(5000, jnp.float32).at[4500].set(-np.inf),
        "host": rng.normal(size=(3, 4)).astype(np.float32),
        "sharded": jax.device_put(jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
                                  NamedSharding(mesh, PartitionSpec("data"))),
    }


def _on_devices(tree) -> integrity.Fingerprints:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    values = jax.device_get(integrity._reduce([x for _, x in flat]))
    return {jax.tree_util.keystr(p, simple=True, separator="/"): [int(c), bool(f)]
            for (p, _), (c, f) in zip(flat, values)}


def test_host_and_device_fingerprints_agree_and_notice_one_changed_word():
    tree = _tree()
    found = integrity.fingerprints(tree)  # CPU arrays, one process: the NumPy path
    assert found == _on_devices(tree)
    assert integrity.non_finite(found) == ["inf", "nan"]

    changed = dict(tree, f32=tree["f32"].at[17, 3].add(1e-6),
                   sharded=tree["sharded"].at[15, 7].set(0.0))
    assert integrity.mismatches(integrity.fingerprints(changed), found) == ["f32", "sharded"]
    # Two words swapped: same values, other order, other checksum (in a row of the host sum,
    # and in a column).
    swapped = dict(tree, int32=tree["int32"][jnp.array([1, 0, *range(2, 105)])],
                   rows=tree["rows"][::-1])
    assert integrity.mismatches(integrity.fingerprints(swapped), found) == ["int32", "rows"]
