"""Sequences per second of one full pretraining step: bertjax vs KerasHub (JAX) vs Hugging
Face Flax vs PyTorch.

  python -m benchmarks.train_step                # mini: L4/H256/A4, B32, S128, P20
  python -m benchmarks.train_step --size=base --batch=16
  python -m benchmarks.train_step --only=bertjax --dropout_rngs=threefry,unsafe_rbg
  python -m benchmarks.train_step --only=bertjax,keras_hub --dropout_mask_bits=16,32
  python -m benchmarks.train_step --only=bertjax,keras_hub --sparse_last_layer=0,1

On a GPU, bf16 compute (parameters stay f32) for the JAX frameworks, BERT-base then
BERT-large beside NVIDIA's published BERT-large figure:

  python -m benchmarks.train_step --size=base --dtype=bfloat16 --only=bertjax,hf_flax --batch=64 --steps=20
  python -m benchmarks.train_step --size=large --dtype=bfloat16 --only=bertjax --batch=64 --steps=20

MFU is then counted against the device's table peak (bertjax/training/metrics.py:PEAK_FLOPS,
dense bf16) as well as the measured bf16 matmul.

Each framework runs the same step on the same inputs: forward with dropout 0.1, masked-LM
loss at the P masked positions plus next-sentence loss, backward, global-norm clipping at 1.0
and bias-corrected AdamW (lr 1e-4, weight decay 0.01 except LayerNorm and biases). bertjax
projects only the P gathered positions onto the vocabulary; the Hugging Face models project
all S positions and then pick the labelled ones. Warm-up steps (compilation) are excluded,
every timed step is waited for (block_until_ready / the loss fetched), and each timing is the
best of several repeats taken in turns, because the machine may be shared. MFU counts the
model's necessary matmul FLOPs (bertjax's, the same for all three) against the best f32
matmul FLOP/s measured on this machine in the same run.

KerasHub's `BertMaskedLM` on Keras 3's JAX backend is the maintained JAX peer a user would try
first. It also projects only the masked positions, but it has no next-sentence head or pooler
(a little less work than the others). It is an optional dependency of this script alone,
installed without its dependencies (keras-hub requires tensorflow-text, which would replace
bertjax's TensorFlow; the model classes used here do not need it):

  .venv/bin/python -m pip install --no-deps keras==3.15.1 keras-hub==0.32.0 namex optree

or leave it out with `--only=bertjax,hf_flax,torch`.
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "jax")  # read when keras is first imported

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import harness, synthetic  # noqa: E402
from bertjax import host_memory  # noqa: E402
from bertjax.models import presets  # noqa: E402
from bertjax.models.heads import BertForPreTraining  # noqa: E402
from bertjax.training import metrics, optimizers, pretrain, sharding, trainer  # noqa: E402

LR, WEIGHT_DECAY, CLIP, DROPOUT = 1e-4, 0.01, 1.0, 0.1
# The published figure to set a GPU run beside (NVIDIA's BERT-large pretraining, phase 1).
NVIDIA_BERT_LARGE = ("NVIDIA publishes 580 seq/s per A100 for BERT-large pretraining at "
                     "seq 128, mixed precision")


def bertjax_step(config, inputs, dropout_rng="threefry"):
    model = BertForPreTraining(config)
    schedule = optax.constant_schedule(LR)
    tx = optimizers.make_optimizer("adamw", schedule, b1=0.9, b2=0.999, eps=1e-6,
                                   weight_decay=WEIGHT_DECAY, clip_norm=CLIP)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    repl = sharding.replicated(mesh)
    ids = jnp.asarray(inputs["input_ids"][:1])
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, ids, ids,
                                 jnp.asarray(inputs["masked_lm_positions"][:1]))["params"])
    # All of the state placed as the step returns it, so the second step does not compile again.
    state = jax.device_put(trainer.TrainState(jnp.zeros((), jnp.int32), params,
                                              tx.init(params)), repl)
    train_step = jax.jit(trainer.make_train_step(pretrain.objective(model, nsp=True), tx,
                                                 schedule, grad_accum_steps=1,
                                                 dropout_rng=dropout_rng),
                         donate_argnums=(0,))
    batch = jax.device_put(inputs, repl)
    rng = jax.random.PRNGKey(1)
    holder = {"state": state}

    def step():
        holder["state"], m = train_step(holder["state"], batch, rng)
        jax.block_until_ready(m["loss"])
    return step


def hf_labels(inputs):
    labels = np.full(inputs["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, inputs["masked_lm_positions"], inputs["masked_lm_ids"], 1)
    return labels


def hf_flax_step(config, inputs):
    import transformers
    hf_config = transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_dropout_prob=DROPOUT,
        attention_probs_dropout_prob=DROPOUT)
    model = transformers.FlaxBertForPreTraining(hf_config, seed=0, dtype=config.dtype)
    tx = optax.chain(optax.clip_by_global_norm(CLIP),
                     optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-6, weight_decay=WEIGHT_DECAY,
                                 mask=optimizers.decay_mask))
    params = model.params
    opt_state = tx.init(params)
    labels = jnp.asarray(hf_labels(inputs))
    batch = {k: jnp.asarray(v) for k, v in inputs.items()}

    def loss_fn(p, rng):
        out = model(batch["input_ids"], attention_mask=batch["input_mask"],
                    token_type_ids=batch["segment_ids"], params=p, dropout_rng=rng, train=True)
        logits, nsp = out.prediction_logits, out.seq_relationship_logits
        valid = labels >= 0
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
        mlm = jnp.sum(ce * valid) / jnp.sum(valid)
        return mlm + optax.softmax_cross_entropy_with_integer_labels(
            nsp, batch["next_sentence_labels"]).mean()

    @jax.jit
    def train_step(p, o, step):
        loss, grads = jax.value_and_grad(loss_fn)(p, jax.random.fold_in(jax.random.PRNGKey(1),
                                                                        step))
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    holder = {"p": params, "o": opt_state, "step": 0}

    def step():
        holder["p"], holder["o"], loss = train_step(holder["p"], holder["o"], holder["step"])
        holder["step"] += 1
        jax.block_until_ready(loss)
    return step


def torch_step(config, inputs):
    import torch
    import transformers
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_dropout_prob=DROPOUT,
        attention_probs_dropout_prob=DROPOUT)
    model = transformers.BertForPreTraining(hf_config).train()
    decay = [p for n, p in model.named_parameters() if "LayerNorm" not in n and "bias" not in n]
    no_decay = [p for n, p in model.named_parameters() if "LayerNorm" in n or "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, eps=1e-6)
    batch = {"input_ids": torch.tensor(inputs["input_ids"], dtype=torch.long),
             "attention_mask": torch.tensor(inputs["input_mask"], dtype=torch.long),
             "token_type_ids": torch.tensor(inputs["segment_ids"], dtype=torch.long),
             "labels": torch.tensor(hf_labels(inputs)),
             "next_sentence_label": torch.tensor(inputs["next_sentence_labels"],
                                                 dtype=torch.long)}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        loss.item()
    return step


def keras_hub_step(config, inputs):
    try:
        import keras
        import keras_hub
    except ImportError as e:
        raise SystemExit(f"KerasHub is not installed ({e}): see this script's docstring for "
                         "the install command, or pass --only=bertjax,hf_flax,torch") from None
    if keras.backend.backend() != "jax":
        raise SystemExit(f"KERAS_BACKEND={keras.backend.backend()}: this comparison is on JAX")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, dropout=DROPOUT,
        max_sequence_length=config.max_position_embeddings)
    model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    optimizer = keras.optimizers.AdamW(learning_rate=LR, weight_decay=WEIGHT_DECAY, beta_1=0.9,
                                       beta_2=0.999, epsilon=1e-6, global_clipnorm=CLIP)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    x = {"token_ids": inputs["input_ids"], "segment_ids": inputs["segment_ids"],
         "padding_mask": inputs["input_mask"].astype(bool),
         "mask_positions": inputs["masked_lm_positions"]}

    def step():  # train_on_batch returns the loss as a Python float: the step is done
        model.train_on_batch(x, inputs["masked_lm_ids"],
                             sample_weight=inputs["masked_lm_weights"])
    return step


def main() -> None:
    parser = harness.parser(__doc__)
    harness.step_flags(parser)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="bertjax,keras_hub,hf_flax,torch")
    # bertjax once per dropout generator named (model.dropout_rng), in turns with the rest.
    parser.add_argument("--dropout_rngs", default="threefry")
    # ... and once per mask width named (model.dropout_mask_bits).
    parser.add_argument("--dropout_mask_bits", default="16")
    # ... and with the last layer at every position (0) or at the read ones (1, the default:
    # model.sparse_last_layer).
    parser.add_argument("--sparse_last_layer", default="1")
    # Compute dtype of the JAX frameworks; the PyTorch and KerasHub steps here are f32 only.
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    # The whole process's host allocator, every framework alike: 'keep' as `bertjax.main`
    # sets it (bertjax/host_memory.py), 'release' the C library's default.
    parser.add_argument("--host_memory", default="keep", choices=("keep", "release"))
    args = parser.parse_args()
    if args.host_memory == "keep":  # before any framework starts its runtime
        host_memory.keep_freed_memory()
    f32_only = {"torch", "keras_hub"} & set(args.only.split(","))
    if args.dtype != "float32" and f32_only:
        parser.error(f"--dtype={args.dtype}: {', '.join(sorted(f32_only))} run in float32 "
                     "here; leave them out of --only (e.g. --only=bertjax,hf_flax)")
    dtype = jnp.dtype(args.dtype)

    config = presets.preset(args.size, vocab_size=args.vocab, dtype=dtype)
    inputs = synthetic.pretraining_batch(args.batch, args.seq_len, args.predictions, args.vocab)
    bench = harness.start(args, dtype=args.dtype)
    peak = bench.peak_flops
    device = jax.devices()[0]
    table_peak = metrics.table_peak_flops(device.device_kind)
    flops = metrics.pretraining_flops_per_sequence(config, args.seq_len, args.predictions)
    print(f"model {args.size} (L{config.num_hidden_layers}/H{config.hidden_size}/"
          f"A{config.num_attention_heads}, vocab {args.vocab}), batch {args.batch}, "
          f"seq {args.seq_len}, predictions {args.predictions}; one {device.platform} device; "
          f"host memory: {args.host_memory}"
          + (f"; {device.device_kind} table peak {table_peak / 1e12:.0f} TFLOP/s"
             if table_peak else "")
          + f"; model FLOPs per sequence (train, gathered MLM): {flops / 1e9:.2f} GFLOP")
    bench.figure("table_peak_flops", table_peak)
    bench.figure("flops_per_sequence", flops)
    builders = {"bertjax": bertjax_step, "keras_hub": keras_hub_step, "hf_flax": hf_flax_step,
                "torch": torch_step}
    names = {"bertjax": "bertjax", "keras_hub": "KerasHub BertMaskedLM (JAX, no NSP)",
             "hf_flax": "HF FlaxBertForPreTraining",
             "torch": "HF BertForPreTraining (PyTorch)"}
    steps, step_flops = {}, {}
    for key in args.only.split(","):
        if key != "bertjax":
            steps[key], step_flops[key] = builders[key](config, inputs), flops
            continue
        for rng in args.dropout_rngs.split(","):
            for bits in map(int, args.dropout_mask_bits.split(",")):
                for sparse in map(int, args.sparse_last_layer.split(",")):
                    kinds = ([f"{rng} dropout"] * (rng != "threefry")
                             + [f"{bits}-bit masks"] * (bits != config.dropout_mask_bits)
                             + ["full last layer"] * (not sparse))
                    variant = f"{key} ({', '.join(kinds)})" if kinds else key
                    names[variant] = variant
                    variant_config = dataclasses.replace(config, dropout_mask_bits=bits,
                                                         sparse_last_layer=bool(sparse))
                    steps[variant] = bertjax_step(variant_config, inputs, rng)
                    # MFU counts what the variant needs: fewer FLOPs for a sparse last layer.
                    step_flops[variant] = metrics.pretraining_flops_per_sequence(
                        variant_config, args.seq_len, args.predictions)
    seconds = harness.time_in_turns(steps, args.warmup, args.steps, args.repeats)
    rates = {key: args.batch / s for key, s in seconds.items()}
    table = bench.table(f"best of {args.repeats} turns of {args.steps} steps each, after "
                        f"{args.warmup} warm-up steps; the machine may be shared with other work",
                        [("framework", ""), ("seq/s", ".1f"), ("ms/step", ".1f"),
                         ("MFU % of measured", ".1f"), ("MFU % of table peak", ".1f")])
    for key, rate in rates.items():
        used = rate * step_flops[key]
        table.row(names[key], rate, 1e3 * seconds[key], 100 * used / peak,
                  100 * used / table_peak if table_peak else None)
    if device.platform == "gpu":
        print(f"reference: {NVIDIA_BERT_LARGE}")
    ratios = bench.table("speed ratios", [("framework", ""), ("against", ""), ("ratio", ".2f")])
    ours = [key for key in rates if key.startswith("bertjax")]
    for key in ours:
        for other in rates:
            if other != key and (key == "bertjax" or other not in ours):
                ratios.row(names[key], names[other], rates[key] / rates[other])
    bench.finish()


if __name__ == "__main__":
    main()
