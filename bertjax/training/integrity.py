"""Fingerprints of saved arrays, so corrupt bytes never train silently.

A fingerprint is, per array, a checksum of its bits (each 32-bit word weighted by an odd
multiple of its position, summed mod 2^32: any changed word, and any reordering, changes it)
and whether all its values are finite. It is computed on the devices as one jitted reduction,
whatever the sharding, and kept as JSON beside a checkpoint or a model directory; reading
them back recomputes it and compares. A checkpoint is never written from non-finite
parameters, so "finite" also guards against saving a diverged state.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Fingerprints = dict[str, list]  # array path -> [checksum, all finite]


def _words(x: jax.Array) -> jax.Array:
    """The array's bits as uint32 words, one per element."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32).reshape(-1)
    bits = jnp.dtype(x.dtype).itemsize * 8
    if bits == 32:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    if bits in (8, 16):
        unsigned = jnp.uint16 if bits == 16 else jnp.uint8
        return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)
    raise ValueError(f"no fingerprint for {x.dtype} arrays")


@jax.jit
def _reduce(leaves: list) -> list:
    out = []
    for x in leaves:
        words = _words(x)
        weights = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(2654435761) | 1
        finite = (jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact)
                  else jnp.bool_(True))
        out.append((jnp.sum(words * weights, dtype=jnp.uint32), finite))
    return out


def fingerprints(tree: Any) -> Fingerprints:
    """Every array of `tree`, by path. All processes must call it (a global reduction)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    values = jax.device_get(_reduce([x for _, x in flat]))
    return {jax.tree_util.keystr(p, simple=True, separator="/"): [int(c), bool(f)]
            for (p, _), (c, f) in zip(flat, values)}


def non_finite(prints: Fingerprints) -> list[str]:
    return [path for path, (_, finite) in prints.items() if not finite]


def mismatches(found: Fingerprints, expected: Fingerprints) -> list[str]:
    """Paths whose stored and recomputed fingerprints differ (or that one side lacks)."""
    return sorted(p for p in set(found) | set(expected) if found.get(p) != expected.get(p))
