"""Optimizers, learning-rate schedules, the weight-decay mask and gradient accumulation.

`bert_adamw` is the optimizer of the original release (`AdamWeightDecayOptimizer`): Adam
moments without bias correction, decoupled weight decay added to the update (so it is scaled
by the learning rate) and skipped for LayerNorm parameters and biases, after global-norm
clipping. `adamw` is the usual bias-corrected AdamW.

`lamb` is LAMB as NVIDIA and TensorFlow Addons run it for BERT: bias-corrected Adam, decoupled
weight decay, then the layer-wise trust ratio ||p|| / ||update|| -- except for LayerNorm
parameters and biases (the MLM output bias included), which get neither decay nor the ratio
(tf-addons `exclude_from_layer_adaptation`, which defaults to the weight-decay exclusions; apex
`multi_tensor_lamb` skips the ratio where decay is off). Scaled by the ratio, a parameter that
starts at zero would take one full step and then almost none. The exclusions go by parameter
kind, as in tf-addons, so `weight_decay=0` still gives the weights their trust ratio; apex
would then drop the ratio everywhere and run plain Adam.
"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("bert_adamw", "adamw", "lamb")
SCHEDULES = ("bert", "warmup_linear")

# The original excludes these by regex search on the variable name.
_NO_DECAY = re.compile(r"layer_norm|LayerNorm|bias")


def decay_mask(params: Any) -> Any:
    """True where weight decay applies: not LayerNorm parameters, not biases."""
    def decays(path, _):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return _NO_DECAY.search(name) is None
    return jax.tree_util.tree_map_with_path(decays, params)


def learning_rate_schedule(kind: str, peak: float, warmup_steps: int,
                           total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then linear decay to 0 at `total_steps`.

    'bert' is the original `optimization.py`: the decay line is counted from step 0
    (lr = peak * (1 - step/total)) and warmup replaces it below `warmup_steps`, so the rate
    just after warmup is peak * (1 - warmup/total). 'warmup_linear' decays from the peak
    reached at the end of warmup.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"optimizer.schedule {kind!r}: expected one of {', '.join(SCHEDULES)}")
    if total_steps <= 0 or warmup_steps < 0:
        raise ValueError(f"schedule needs warmup_steps >= 0 (got {warmup_steps}) and "
                         f"num_steps > 0 (got {total_steps})")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / max(warmup_steps, 1)
        if kind == "bert":
            decayed = peak * (1.0 - step / total_steps)
        else:
            decayed = peak * (total_steps - step) / max(total_steps - warmup_steps, 1)
        return jnp.where(step < warmup_steps, warm, jnp.maximum(decayed, 0.0))
    return schedule


class BertAdamState(NamedTuple):
    mu: Any
    nu: Any


def scale_by_bert_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """Adam direction m / (sqrt(v) + eps) with no bias correction, as the original BERT."""
    def init(params):
        zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)
        return BertAdamState(mu=zeros, nu=jax.tree.map(jnp.copy, zeros))

    def update(grads, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, BertAdamState(mu=mu, nu=nu)
    return optax.GradientTransformation(init, update)


def make_optimizer(name: str, schedule: optax.Schedule, *, b1: float, b2: float, eps: float,
                   weight_decay: float, clip_norm: float | None) -> optax.GradientTransformation:
    """The named optimizer after global-norm clipping (`clip_norm` None: no clipping)."""
    if name == "bert_adamw":
        core = optax.chain(scale_by_bert_adam(b1, b2, eps),
                           optax.add_decayed_weights(weight_decay, decay_mask),
                           optax.scale_by_learning_rate(schedule))
    elif name == "adamw":
        core = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                           mask=decay_mask)
    elif name == "lamb":
        # optax.lamb's mask covers the decay only; its trust ratio would scale every leaf.
        core = optax.chain(optax.scale_by_adam(b1, b2, eps),
                           optax.add_decayed_weights(weight_decay, decay_mask),
                           optax.masked(optax.scale_by_trust_ratio(), decay_mask),
                           optax.scale_by_learning_rate(schedule))
    else:
        raise ValueError(f"optimizer.name {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    if clip_norm is not None:
        return optax.chain(optax.clip_by_global_norm(clip_norm), core)
    return core


def split_micro_batches(batch: dict, num_micro: int) -> dict:
    """[B, ...] -> [num_micro, B/num_micro, ...]; micro-batch a holds rows a, a+n, a+2n, ...

    Interleaving keeps every row on the device that already holds it when the batch axis is
    sharded in contiguous blocks, so splitting needs no communication.
    """
    def split(x):
        if x.shape[0] % num_micro:
            raise ValueError(f"batch of {x.shape[0]} does not split into {num_micro} "
                             "micro-batches (grad_accum_steps must divide global_batch_size)")
        x = x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)
    return jax.tree.map(split, batch)


def accumulate_gradients(loss_fn: Callable, params: Any, batch: dict, num_micro: int):
    """Sums (loss, aux) and gradients of `loss_fn(params, micro_batch, index)` over micro-batches.

    `loss_fn` must return a loss already normalised by the *whole* batch (e.g. a weighted sum
    divided by the full batch's weight total), so the sum over micro-batches equals the
    full-batch loss and one optimizer update per step sees the same gradient.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_micro == 1:
        return grad_fn(params, batch, 0)
    micro = split_micro_batches(batch, num_micro)

    def body(carry, xs):
        index, mb = xs
        (loss, aux), grads = grad_fn(params, mb, index)
        return jax.tree.map(jnp.add, carry, ((loss, aux), grads)), None

    shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), 0)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    total, _ = jax.lax.scan(body, zeros, (jnp.arange(num_micro), micro))
    return total
