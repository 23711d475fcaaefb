"""Compile time and temporary memory of the pretraining step: per-layer vs scanned layers
(`model.scan_layers`), with and without remat, from abstract shapes (nothing is allocated, so
BERT-large is measured on a machine it would not train on).

  python -m benchmarks.compile_time
  python -m benchmarks.compile_time --sizes=base --batch=8 --seq_len=512

Each variant traces, lowers and compiles the trainer's `train_step` (bert_adamw, dropout
0.1, the MLM + NSP objective) for the default device; "temp" is XLA's own figure for the
step's temporary buffers (activations kept for the backward pass, workspace), from the
compiled executable's memory analysis.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from benchmarks import harness  # noqa: E402
from bertjax.models import presets  # noqa: E402
from bertjax.models.heads import BertForPreTraining, init_params  # noqa: E402
from bertjax.training import optimizers, pretrain, trainer  # noqa: E402


def compile_step(config, batch: int, seq_len: int, predictions: int) -> tuple[float, int]:
    """(seconds to trace, lower and compile the step, temporary bytes)."""
    model = BertForPreTraining(config)
    schedule = optax.constant_schedule(1e-4)
    tx = optimizers.make_optimizer("bert_adamw", schedule, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=0.01, clip_norm=1.0)
    params = nn.unbox(jax.eval_shape(functools.partial(init_params, model),
                                     jax.random.PRNGKey(0)))
    state = trainer.TrainState(jax.ShapeDtypeStruct((), jnp.int32), params,
                               jax.eval_shape(tx.init, params))
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    inputs = {"input_ids": ints(batch, seq_len), "input_mask": ints(batch, seq_len),
              "segment_ids": ints(batch, seq_len),
              "masked_lm_positions": ints(batch, predictions),
              "masked_lm_ids": ints(batch, predictions),
              "masked_lm_weights": jax.ShapeDtypeStruct((batch, predictions), jnp.float32),
              "next_sentence_labels": ints(batch)}
    step = jax.jit(trainer.make_train_step(pretrain.objective(model, nsp=True), tx, schedule,
                                           grad_accum_steps=1), donate_argnums=(0,))
    start = time.perf_counter()
    compiled = step.lower(state, inputs, jax.ShapeDtypeStruct((2,), jnp.uint32)).compile()
    seconds = time.perf_counter() - start
    return seconds, compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--sizes", default="base,large")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    args = parser.parse_args()
    bench = harness.start(args)
    table = bench.table(f"batch {args.batch}, seq {args.seq_len}, predictions {args.predictions}, "
                        "f32", [("size", ""), ("layers", ""), ("remat", ""), ("compile s", ".1f"),
                                ("temp GiB", ".2f")])
    for size in args.sizes.split(","):
        for scan, remat in ((False, False), (True, False), (True, True)):
            config = dataclasses.replace(presets.preset(size), scan_layers=scan, remat=remat)
            seconds, temp = compile_step(config, args.batch, args.seq_len, args.predictions)
            table.row(size, "scanned" if scan else "per layer",
                      "nothing saved" if remat else "off", seconds, temp / 2**30)
    bench.finish()


if __name__ == "__main__":
    main()
