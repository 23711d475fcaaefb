"""Whether bf16 compute pays on this machine: the FLOP/s of one dense layer's three matmuls
(forward x@W, input gradient g@W^T, weight gradient x^T@g) in float32 and in bf16, under XLA
(what bertjax runs) and PyTorch, at the mini model's shapes.

  python -m benchmarks.matmul_dtypes
  python -m benchmarks.matmul_dtypes --rows=4096 --inner=256 --outer=1024

bf16 is timed twice under XLA: with a bf16 result (what a Flax layer with dtype=bfloat16
computes) and accumulated into a float32 result (`preferred_element_type`, how matrix units
run at their peak). Each figure is the best of several timed calls after a warm-up.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness

# (name, dot of (x [R, I], w [I, O], g [R, O])): the three products of a dense layer's step.
PRODUCTS = (("forward x@W", lambda x, w, g, **kw: jnp.dot(x, w, **kw)),
            ("input grad g@W^T", lambda x, w, g, **kw: jnp.dot(g, w.T, **kw)),
            ("weight grad x^T@g", lambda x, w, g, **kw: jnp.dot(x.T, g, **kw)))


def xla_rates(x, w, g, repeats: int) -> dict:
    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    rates = {}
    for dtype, kwargs, label in ((jnp.float32, {}, "float32"),
                                 (jnp.bfloat16, {}, "bf16, bf16 result"),
                                 (jnp.bfloat16, {"preferred_element_type": jnp.float32},
                                  "bf16, float32 accumulate")):
        args = [jnp.asarray(a, dtype) for a in (x, w, g)]
        for name, product in PRODUCTS:
            step = jax.jit(lambda x, w, g, product=product: product(x, w, g, **kwargs))
            rates[("XLA", label, name)] = flops / harness.best_seconds(
                lambda: step(*args).block_until_ready(), repeats)
    return rates


def torch_rates(x, w, g, repeats: int) -> dict:
    import torch

    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    rates = {}
    for dtype, label in ((torch.float32, "float32"), (torch.bfloat16, "bf16")):
        tx, tw, tg = (torch.from_numpy(a).to(dtype) for a in (x, w, g))
        for name, product in (("forward x@W", lambda: tx @ tw),
                              ("input grad g@W^T", lambda: tg @ tw.T),
                              ("weight grad x^T@g", lambda: tx.T @ tg)):
            rates[("PyTorch", label, name)] = flops / harness.best_seconds(product, repeats)
    return rates


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--rows", type=int, default=4096, help="batch x sequence positions")
    parser.add_argument("--inner", type=int, default=256, help="the layer's input width")
    parser.add_argument("--outer", type=int, default=1024, help="the layer's output width")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no_torch", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.inner), np.float32)
    w = rng.standard_normal((args.inner, args.outer), np.float32)
    g = rng.standard_normal((args.rows, args.outer), np.float32)
    bench = harness.start(args)
    rates = xla_rates(x, w, g, args.repeats)
    if not args.no_torch:
        rates.update(torch_rates(x, w, g, args.repeats))
    names = [name for name, _ in PRODUCTS]
    table = bench.table(f"GFLOP/s, x [{args.rows}, {args.inner}] @ W [{args.inner}, {args.outer}]",
                        [("framework, dtype", "")] + [(n, ".0f") for n in names])
    for framework, label in dict.fromkeys((f, l) for f, l, _ in rates):
        table.row(f"{framework}, {label}", *(rates[(framework, label, n)] / 1e9 for n in names))
    bench.finish()


if __name__ == "__main__":
    main()
