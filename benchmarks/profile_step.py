"""Where the time of one training step goes: measured time by op family, pretraining and
fine-tuning.

  python -m benchmarks.profile_step                 # mini, B32, S128 (P20)
  python -m benchmarks.profile_step --size=base --batch=8 --steps=2
  python -m benchmarks.profile_step --dropout_rng=counter_hash

Each step (bertjax's jitted `train_step`, as the trainer runs it, on one device) is traced
with the JAX profiler. XLA's CPU runtime records one event per executed HLO op (a "thunk":
a fusion, a dot, a scatter...) with its measured duration; the compiled HLO says what each op
is made of (its opcodes and the JAX op names of everything fused into it), which puts it in
one family. A fused op counts once, under the first family of FAMILIES whose rule any part
of it matches, so a bias-add fused into a matmul counts as matmul time. Ops of both threads
of the CPU are summed, so "op time" can exceed the step's wall time when ops ran in
parallel. Host-to-device is the separate, measured cost of turning the numpy batch into the
step's device arrays (what `Trainer.global_batch` does every step). The trace files stay in
--out for TensorBoard's profile plugin or Perfetto.
"""

from __future__ import annotations

import collections
import os
import re
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import harness, synthetic  # noqa: E402
from bertjax import files, host_memory  # noqa: E402
from bertjax.models import presets  # noqa: E402
from bertjax.models.heads import BertForPreTraining, BertForSequenceClassification  # noqa: E402
from bertjax.tasks import base as tasks  # noqa: E402
from bertjax.training import finetune, finetune_config, metrics, optimizers, pretrain  # noqa: E402
from bertjax.training import sharding, trainer  # noqa: E402
from bertjax.training.config_sections import DEFAULT_RULES  # noqa: E402

# (family, rule) in the order a fused op is tested. A rule sees the op's `Parts`.
FAMILIES = (
    ("matmul: MLM decoder (tied, vocab)", lambda p: p.dot and p.names_with(".attend")),
    ("matmul: attention QK^T and PV", lambda p: p.dot and p.attention_einsum()),
    ("matmul: dense layers", lambda p: p.dot),
    ("dropout: RNG bits and mask", lambda p: p.names_with(*RNG_NAMES)
     or "rng-bit-generator" in p.opcodes),
    ("embedding gradient (scatter-add)", lambda p: "scatter" in p.opcodes
     and p.names_with("embeddings")),
    ("optimizer update (clip, AdamW)", lambda p: "jvp(" not in p.root_name),
    ("loss on logits [B,P,V] + their gradient", lambda p: "jvp()" in p.root_name
     or p.vocab_sized),
    ("attention softmax + mask", lambda p: p.attention_softmax()),
    ("GELU", lambda p: p.names_with("erf", "gelu", "tanh")),
    ("LayerNorm", lambda p: p.names_with("layer_norm")),
    ("layout: copies, transposes, broadcasts", lambda p: p.opcodes <= LAYOUT_OPCODES),
    ("other elementwise / reductions", lambda p: True),
)
# jax.random's names inside dropout: the key fold-in, the random bits, bits -> uniform ->
# the keep mask; and 16-bit masks' module (words split in two, compared, selected).
RNG_NAMES = ("threefry", "random_bits", "_bernoulli", "_uniform", "random_wrap",
             "HalfWordDropout")
LAYOUT_OPCODES = {"copy", "transpose", "bitcast", "broadcast", "reshape", "slice",
                  "concatenate", "pad", "parameter", "constant", "iota", "tuple",
                  "get-tuple-element", "dynamic-slice", "dynamic-update-slice", "fusion"}
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][a-z\-]*)\((.*)$")


class Parts:
    """What one executed HLO op is made of: opcodes and JAX op names, fusions opened."""

    def __init__(self, name: str, hlo: dict, vocab_size: int):
        self.opcodes, self.names = set(), set()
        _, shape, _, _ = hlo[name]
        self.root_name = _op_name(hlo[name][3])
        self.vocab_sized = bool(re.search(rf"\b{vocab_size}\b", shape))
        todo = [name]
        while todo:
            _, _, opcode, rest = hlo[todo.pop()]
            self.opcodes.add(opcode)
            self.names.add(_op_name(rest))
            for callee in re.findall(r"calls=%([\w.\-]+)", rest):
                todo.extend(hlo["computations"].get(callee, ()))
        self.dot = bool(self.opcodes & {"dot", "convolution"})

    def names_with(self, *needles: str) -> bool:
        return any(n in name for name in self.names for n in needles)

    def attention_einsum(self) -> bool:
        # Attention's own einsums (named by their subscripts), not its projections.
        return any(re.search(r"/attention/(b[a-z]+,b[a-z]+->|dot_product_attention)", name)
                   for name in self.names)

    def attention_softmax(self) -> bool:
        # What Attention computes besides its projections, einsums and dropout: the scale,
        # the mask and the softmax.
        return any(re.search(r"/attention/(?!query|key|value|attention_output|Dropout|"
                             r"b[a-z]+,b[a-z]+->)", name) for name in self.names)


def _op_name(rest: str) -> str:
    found = re.search(r'op_name="([^"]*)"', rest)
    return found.group(1) if found else ""


def parse_hlo(text: str) -> dict:
    """{instruction name: (computation, shape, opcode, the rest of the line)}, plus
    'computations': {computation name: [its instruction names]}."""
    hlo, computations, current = {}, {}, None
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if header:
            current = header.group(1)
            computations[current] = []
            continue
        found = INSTRUCTION.match(line)
        if found and current is not None:
            name, shape, opcode, rest = found.groups()
            hlo[name] = (current, shape, opcode, rest)
            computations[current].append(name)
    hlo["computations"] = computations
    return hlo


def op_durations(trace_dir: str, module: str) -> collections.Counter:
    """Total measured nanoseconds per HLO op of `module` in the newest trace of `trace_dir`."""
    newest = max(files.glob(f"{trace_dir}/plugins/profile/*/*.xplane.pb"))
    data = jax.profiler.ProfileData.from_serialized_xspace(files.read_bytes(newest))
    total = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") == module and "hlo_op" in stats:
                    total[stats["hlo_op"]] += event.duration_ns
    return total


def family_table(durations: collections.Counter, hlo: dict, vocab_size: int,
                 steps: int) -> dict[str, float]:
    """Milliseconds per step by family."""
    ms = collections.Counter()
    for op, ns in durations.items():
        parts = Parts(op, hlo, vocab_size)
        family = next(f for f, rule in FAMILIES if rule(parts))
        ms[family] += ns / 1e6 / steps
    return ms


def pretraining_step(config, batch: int, seq_len: int, predictions: int):
    model = BertForPreTraining(config)
    inputs = synthetic.pretraining_batch(batch, seq_len, predictions, config.vocab_size)
    schedule = optax.constant_schedule(1e-4)
    tx = optimizers.make_optimizer("bert_adamw", schedule, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=0.01, clip_norm=1.0)
    return model, pretrain.objective(model, nsp=True), tx, schedule, inputs


def finetuning_step(config, batch: int, seq_len: int):
    """Sentence classification as fine-tuning runs it: the default recipe, 2 labels."""
    settings = finetune_config.defaults()
    model = BertForSequenceClassification(config, 2)
    task = tasks.get("classification")(settings.task)
    tx, schedule = finetune.make_optimizer(settings.optimizer, 1000)
    rng = np.random.default_rng(0)
    lengths = rng.integers(seq_len // 4, seq_len + 1, batch)
    mask = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)
    inputs = {"input_ids": rng.integers(5, config.vocab_size, (batch, seq_len)).astype(np.int32)
              * mask, "input_mask": mask, "segment_ids": np.zeros_like(mask),
              "label": rng.integers(0, 2, batch).astype(np.int32)}
    return model, finetune.objective(model, task), tx, schedule, inputs


def profile(label: str, built, config, steps: int, out: str, mesh, dropout_rng: str) -> dict:
    model, objective, tx, schedule, inputs = built
    init_args = [jnp.asarray(inputs[k][:1]) for k in tasks.INPUTS]
    if "masked_lm_positions" in inputs:
        init_args.append(jnp.asarray(inputs["masked_lm_positions"][:1]))
    params = nn.unbox(model.init(jax.random.PRNGKey(0), *init_args)["params"])
    state = trainer.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    batch_sharding = sharding.batch_sharding(mesh, DEFAULT_RULES)
    batch_size = len(inputs["input_ids"])

    def place():
        placed = sharding.make_global_batch(inputs, batch_sharding, batch_size)
        return jax.block_until_ready(placed)

    batch, rng = place(), jax.random.PRNGKey(1)
    compiled = jax.jit(trainer.make_train_step(objective, tx, schedule, 1, dropout_rng),
                       donate_argnums=(0,)).lower(state, batch, rng).compile()
    holder = {"state": state}

    def step():
        holder["state"], m = compiled(holder["state"], batch, rng)
        jax.block_until_ready(m)

    seconds = harness.time_in_turns({"step": step, "place": place}, warmup=2, steps=steps,
                                    repeats=3)
    # What the host allocator costs: page faults and kernel time over the same steps, after
    # the timing's warm-up (bertjax/host_memory.py says why they can be most of a step).
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(steps):
        step()
    after = resource.getrusage(resource.RUSAGE_SELF)
    host = {"scratch_mb": compiled.memory_analysis().temp_size_in_bytes / 1e6,
            "faults": (after.ru_minflt - before.ru_minflt) / steps,
            "system_ms": 1e3 * (after.ru_stime - before.ru_stime) / steps}
    trace_dir = os.path.join(out, label)
    with jax.profiler.trace(trace_dir):
        for _ in range(steps):
            step()
    hlo = parse_hlo(compiled.as_text())
    module = re.match(r"HloModule (\S+?),", compiled.as_text()).group(1)
    table = family_table(op_durations(trace_dir, module), hlo, config.vocab_size, steps)
    return {"table": table, "wall_ms": 1e3 * seconds["step"],
            "place_ms": 1e3 * seconds["place"], "batch": batch_size, "host": host}


def tables(bench: harness.Run, results: dict, flops: dict, peak: float) -> None:
    families = [f for f, _ in FAMILIES]
    table = bench.table("time by op family", [("op family", "")]
                        + [(f"{k} ms/step", ".1f") for k in results]
                        + [(f"{k} %", ".1f") for k in results])
    for family in families + ["host-to-device (batch placement)"]:
        values, shares = [], []
        for r in results.values():
            total = sum(r["table"].values())
            ms = r["place_ms"] if family.startswith("host") else r["table"].get(family, 0.0)
            values.append(ms)
            shares.append(100 * ms / total)
        table.row(family, *values, *shares)
    none = [None] * len(results)
    table.row("**sum of op time**", *(sum(r["table"].values()) for r in results.values()),
              *none)
    table.row("**step wall time**", *(r["wall_ms"] for r in results.values()), *none)
    summary = bench.table(
        "each step: its speed, its matmuls against the measured peak, and what the host "
        "allocator costs",
        [("step", ""), ("seq/s", ".1f"), ("MFU % of measured peak", ".1f"),
         ("matmuls at peak ms", ".1f"), ("matmuls measured ms", ".1f"),
         ("scratch MB a step", ".0f"), ("page faults a step", ",.0f"),
         ("system ms a step", ".0f")])
    for key, r in results.items():
        ideal = 1e3 * flops[key] * r["batch"] / peak
        matmul = sum(v for k, v in r["table"].items() if k.startswith("matmul"))
        host = r["host"]
        summary.row(key, r["batch"] / r["wall_ms"] * 1e3, 100 * ideal / r["wall_ms"], ideal,
                    matmul, host["scratch_mb"], host["faults"], host["system_ms"])


def main() -> None:
    parser = harness.parser(__doc__)
    harness.step_flags(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="/tmp/bertjax_profile", help="the trace files")
    parser.add_argument("--dropout_rng", default="threefry", choices=trainer.DROPOUT_RNGS,
                        help="model.dropout_rng of both steps")
    parser.add_argument("--host_memory", default="keep", choices=("keep", "release"),
                        help="the process's host allocator (bertjax/host_memory.py): 'keep' "
                             "as bertjax.main sets it, 'release' the C library's default")
    args = parser.parse_args()
    if args.host_memory == "keep":  # before JAX starts its runtime
        host_memory.keep_freed_memory()

    config = presets.preset(args.size, vocab_size=args.vocab)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    bench = harness.start(args)
    print(f"host memory: {args.host_memory}; model {args.size} (L{config.num_hidden_layers}/"
          f"H{config.hidden_size}/A{config.num_attention_heads}, vocab {args.vocab}), batch "
          f"{args.batch}, seq {args.seq_len}, predictions {args.predictions}, dropout 0.1 "
          f"({args.dropout_rng} bits), f32")
    results = {
        "pretrain": profile("pretrain", pretraining_step(config, args.batch, args.seq_len,
                                                         args.predictions),
                            config, args.steps, args.out, mesh, args.dropout_rng),
        "finetune": profile("finetune", finetuning_step(config, args.batch, args.seq_len),
                            config, args.steps, args.out, mesh, args.dropout_rng)}
    flops = {"pretrain": metrics.pretraining_flops_per_sequence(config, args.seq_len,
                                                                args.predictions),
             "finetune": metrics.encoder_flops_per_sequence(
                 config, args.seq_len, BertForSequenceClassification.read_positions)}
    tables(bench, results, flops, bench.peak_flops)
    print(f"traces in {args.out}")
    bench.finish()


if __name__ == "__main__":
    main()
