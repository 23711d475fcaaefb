"""Attention on a TPU at BERT's shapes, compiled ahead of time on this machine: per-chip
temporary memory and FLOPs of the pretraining train step with each attention implementation.

  python -m benchmarks.tpu_attention
  python -m benchmarks.tpu_attention --layers=2 --seq_lens=512 --slice=v5e:4x4

Needs libtpu installed; no TPU is used: the slice's chips are described as
`bertjax.main --compile_only` describes them (training/plan.py). Each variant traces, lowers
and compiles the trainer's `train_step` (bert_adamw, the MLM + NSP objective, the sparse last
layer, bfloat16 compute, hidden dropout 0.1) for the slice (default v5e:2x2), the batch split
over its chips (`mesh.shape` (chips, 1, 1)), from abstract arrays placed on the mesh and
inside the default logical axis rules, as the trainer and the plan trace it. The variants:

  xla+dropout  today's default: attention_probs_dropout_prob=0.1, explicit scores
  xla          attention_probs_dropout_prob=0: jax.nn.dot_product_attention (XLA's own)
  splash       attention='splash' (Pallas's splash-attention kernel), dropout 0

"[B,H,L,L] kept": the dtypes of the one-chip [rows, heads, L, L] arrays (scores,
probabilities) the compiled step materialises, read from its optimized HLO. "temp" is XLA's
figure for the step's temporary buffers on one chip (activations kept for the backward pass,
workspace), from the executable's memory analysis; "GFLOP" is XLA's cost analysis per chip,
which cannot see inside a Pallas kernel: the splash rows add the kernel's own matmuls,
counted here (see kernel_gflop). A variant that does not compile prints its error's first
line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Nothing runs: JAX's backend is the CPU; libtpu only describes the slice and compiles for it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from benchmarks import harness  # noqa: E402
from bertjax.models import presets  # noqa: E402
from bertjax.models.heads import BertForPreTraining, init_params  # noqa: E402
from bertjax.training import (config_sections, optimizers, plan, pretrain, sharding,  # noqa: E402
                              trainer)

VARIANTS = {  # name: (attention, attention_probs_dropout_prob)
    "xla+dropout": ("xla", 0.1),
    "xla": ("xla", 0.0),
    "splash": ("splash", 0.0),
}
# seq len -> max_predictions_per_seq: the original recipe's two phases.
PREDICTIONS = {128: 20, 512: 80}


def tpu_mesh(slice_name: str) -> jax.sharding.Mesh:
    """The slice's chips (as `--compile_only` describes them), the batch split over all."""
    return sharding.make_mesh((-1, 1, 1), plan.slice_devices(plan.parse_slice(slice_name)))


def kernel_gflop(config, batch: int, seq_len: int) -> float:
    """The splash kernel's matmul FLOPs in one train step (all chips), which XLA's cost
    analysis does not count: per full layer 9 products of 2 * B * H * L * L * K FLOPs:
    forward QK^T and PV; backward, the dQ kernel QK^T again, dP and dQ, the dK/dV kernel QK^T
    and dP again, dV and dK. The sparse last layer's gathered queries run XLA's attention
    and are counted by XLA."""
    layers = config.num_hidden_layers - config.sparse_last_layer
    product = 2 * batch * config.num_attention_heads * seq_len * seq_len * config.head_dim
    return 9 * product * layers / 1e9


def score_buffers(hlo: str, rows: int, heads: int, seq_len: int) -> str:
    """The dtypes of [rows, heads, L, L] arrays the compiled step materialises (instructions
    of its entry computation, not values inside a fusion): the attention scores or
    probabilities of one chip's rows. Not counted: the splash kernel's outputs and their
    copies: its log-sum-exp comes out [rows, heads, L, 128] (one value per query across 128
    lanes) and is reduced to one at once; at L = 128 it has the scores' shape."""
    entry = hlo[hlo.index("\nENTRY"):].splitlines()
    kernel_outputs: set[str] = set()
    found = set()
    shape = re.compile(rf"\b([a-z]+[0-9]*)\[{rows},{heads},{seq_len},{seq_len}\]")
    for line in entry:
        # %name = <result type> op(%first_operand, ...)
        defined = re.match(r"\s*(?:ROOT )?(%[\w.-]+) = (.*?) ([a-z-]+)\((%[\w.-]+)?", line)
        if not defined:
            continue
        name, result, op, operand = defined.groups()
        if "splash_mha" in name or (op in ("get-tuple-element", "copy", "bitcast")
                                     and operand in kernel_outputs):
            kernel_outputs.add(name)
            continue
        found.update(shape.findall(result))
    return ", ".join(sorted(found)) or "none"


def compile_step(config, mesh, rules, batch: int, seq_len: int):
    """(compile seconds, compiled executable) of the train step on `mesh`."""
    model = BertForPreTraining(config)
    schedule = optax.constant_schedule(1e-4)
    tx = optimizers.make_optimizer("bert_adamw", schedule, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=0.01, clip_norm=1.0)
    boxed = jax.eval_shape(functools.partial(init_params, model), jax.random.PRNGKey(0))
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    params = trainer.with_shardings(nn.unbox(boxed), param_sh)
    abstract_opt = jax.eval_shape(tx.init, params)
    opt_sh = sharding.optimizer_shardings(tx, abstract_opt, param_sh, mesh)
    replicated = sharding.replicated(mesh)
    state_sh = trainer.TrainState(replicated, param_sh, opt_sh)
    state = trainer.TrainState(jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), params,
                               trainer.with_shardings(abstract_opt, opt_sh))
    rows = sharding.batch_sharding(mesh, rules)
    predictions = PREDICTIONS[seq_len]

    def spec(*shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
    inputs = {"input_ids": spec(batch, seq_len), "input_mask": spec(batch, seq_len),
              "segment_ids": spec(batch, seq_len),
              "masked_lm_positions": spec(batch, predictions),
              "masked_lm_ids": spec(batch, predictions),
              "masked_lm_weights": spec(batch, predictions, dtype=jnp.float32),
              "next_sentence_labels": spec(batch)}
    step = jax.jit(trainer.make_train_step(pretrain.objective(model, nsp=True), tx, schedule,
                                           grad_accum_steps=1),
                   in_shardings=(state_sh, rows, replicated),
                   out_shardings=(state_sh, replicated), donate_argnums=(0,))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    start = time.perf_counter()
    with nn.logical_axis_rules(rules):
        compiled = step.lower(state, inputs, key).compile()
    return time.perf_counter() - start, compiled


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--slice", default="v5e:2x2",
                        help="a Cloud TPU accelerator type or topology, as --compile_only")
    parser.add_argument("--size", default="base")
    parser.add_argument("--layers", type=int, default=0, help="0: the preset's")
    parser.add_argument("--per_chip", type=int, default=8, help="sequences per chip")
    parser.add_argument("--seq_lens", default="128,512")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    mesh = tpu_mesh(args.slice)
    bench = harness.start(args)
    chips = mesh.devices.size
    batch = args.per_chip * chips
    base = dataclasses.replace(presets.preset(args.size), dtype=jnp.bfloat16)
    if args.layers:
        base = dataclasses.replace(base, num_hidden_layers=args.layers)
    table = bench.table(
        f"compiled here for {args.slice} ({chips} x {mesh.devices.flat[0].device_kind}); "
        f"BERT-{args.size} {base.num_hidden_layers} layers, bf16, global batch {batch} "
        f"({args.per_chip} per chip), mesh {dict(mesh.shape)}; pretraining train step, per chip",
        [("seq", "d"), ("attention", ""), ("[B,H,L,L] kept", ""), ("temp GiB", ".2f"),
         ("args GiB", ".2f"), ("GFLOP (XLA)", ".1f"), ("+ kernel GFLOP", ".1f"),
         ("compile s", ".0f")])
    rules = config_sections.DEFAULT_RULES
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        for name in args.variants.split(","):
            attention, dropout = VARIANTS[name]
            config = dataclasses.replace(base, attention=attention,
                                         attention_probs_dropout_prob=dropout)
            try:
                seconds, compiled = compile_step(config, mesh, rules, batch, seq_len)
            except Exception as e:  # noqa: BLE001 - a measurement: report and go on
                first = (str(e).strip().splitlines() or [""])[0][:200]
                table.row(seq_len, name, f"does not compile: {type(e).__name__}: {first}",
                          None, None, None, None, None)
                continue
            memory = compiled.memory_analysis()
            flops = compiled.cost_analysis()["flops"]
            kernel = (kernel_gflop(config, batch, seq_len) / chips
                      if attention == "splash" else None)
            scores = score_buffers(compiled.as_text(), args.per_chip,
                                   config.num_attention_heads, seq_len)
            table.row(seq_len, name, scores, memory.temp_size_in_bytes / 2**30,
                      memory.argument_size_in_bytes / 2**30, flops / 1e9, kernel, seconds)
    bench.finish()


if __name__ == "__main__":
    main()
