"""Real tokens per row of fine-tuning batches on real data: padded to max_seq_length (the
original), cut to length buckets (`train.bucket_lengths`), packed (`train.examples_per_row`);
with --steps, the training speed of each in examples per second.

  python -m benchmarks.padding_waste
  python -m benchmarks.padding_waste --max_seq_length=256 --batch=32
  python -m benchmarks.padding_waste --steps=4 --size=mini
  python -m benchmarks.padding_waste --eval_rows=1024 --size=mini

The data are the fine-tuning benchmark's short-text sets (benchmarks/real_data.py): the 10,605
VADER movie-review snippets (single sentences) and 2,000 Austen sentence pairs, tokenized
by the MiniLM WordPiece vocabulary as bertjax's classification features. Bucketed batches are
one epoch of the training order (fixed-seed permutation, batch --batch); the share is real
tokens over the positions the steps compute (rows x their length), so it is the fraction of
the encoder's work that is not padding.

--steps times the fine-tuning train step (regression on the VADER scores, the --size preset
with the MiniLM vocabulary, dropout 0.1, the default optimizer, one device) on the first
--steps batches of each kind, in turns, best of --repeats, after running every batch shape
once (compilation): examples trained per second, padded vs bucketed vs packed.

--eval_rows times evaluation as fine-tuning runs it (`trainer.batched_outputs`, batches of
--eval_batch, the same model's forward) on the first --eval_rows VADER snippets, padded vs
bucketed (rows sorted by length, each batch cut to its bucket), best of --repeats after a
first pass that compiles: examples evaluated per second.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np

from benchmarks import harness, real_data
from benchmarks.task_data import wordpiece
from bertjax.batching import PACKED_ARRAYS, bucket_length, pack_rows
from bertjax.models import presets
from bertjax.models.heads import BertForSequenceClassification, init_params
from bertjax.tasks import base as tasks
from bertjax.tasks.classify import TextExample, classification_features
from bertjax.training import finetune, finetune_config, trainer


def shares(mask: np.ndarray, batch: int, buckets: tuple[int, ...], per_row: int) -> dict:
    real = int(mask.sum())
    order = finetune.epoch_order(len(mask), 0, 0)
    batches = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    bucketed = sum(len(rows) * bucket_length({"input_mask": mask[rows]}, buckets)
                   for rows in batches)
    kept = sum(int(mask[rows].sum()) for rows in batches)
    packed = pack_rows({"input_mask": mask, "input_ids": mask, "segment_ids": mask}, (),
                       per_row)["input_mask"]
    return {"rows": len(mask), "padded": real / mask.size, "bucketed": kept / bucketed,
            "packed rows": len(packed), "packed": real / packed.size}


def training_speed(arrays: dict, args, buckets: tuple[int, ...]) -> dict[str, float]:
    """Examples per second of the first `args.steps` training batches, padded, bucketed
    and packed."""
    settings = finetune_config.defaults()
    task = tasks.get("regression")(settings.task)
    model = BertForSequenceClassification(presets.preset(args.size, vocab_size=30522), 1)
    tx, schedule = finetune.make_optimizer(settings.optimizer, 1000)
    step = jax.jit(trainer.make_train_step(finetune.objective(model, task), tx, schedule, 1))
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    state = trainer.TrainState(jax.numpy.zeros((), jax.numpy.int32), params, tx.init(params))
    keys = tasks.INPUTS + task.targets
    packed = pack_rows(arrays, task.targets, args.examples_per_row)
    packed_keys = keys + PACKED_ARRAYS
    kinds = {}
    for name, source, source_keys, cut in (("padded", arrays, keys, ()),
                                           ("bucketed", arrays, keys, buckets),
                                           ("packed", packed, packed_keys, ())):
        per_epoch = len(source["input_ids"]) // args.batch
        batches = finetune.training_batches(source, source_keys, args.batch, per_epoch, 0, 0,
                                            cut)
        chosen = [next(batches) for _ in range(args.steps)]
        examples = sum(float(b["example_weights"].sum()) if "example_weights" in b
                       else len(b["input_ids"]) for b in chosen)
        kinds[name] = ([jax.device_put(b) for b in chosen], examples)
    rng = jax.random.PRNGKey(1)

    def epoch(batches):
        def run():
            for batch in batches:
                jax.block_until_ready(step(state, batch, rng))
        return run
    # The untimed first turn compiles every shape.
    best = harness.time_in_turns({name: epoch(batches) for name, (batches, _) in kinds.items()},
                                 warmup=1, steps=1, repeats=args.repeats)
    return {name: kinds[name][1] / best[name] for name in kinds}


def evaluation_speed(arrays: dict, args, buckets: tuple[int, ...]) -> dict[str, float]:
    """Examples per second of evaluating the first `args.eval_rows` rows, padded and
    bucketed."""
    model = BertForSequenceClassification(presets.preset(args.size, vocab_size=30522), 1)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    step = jax.jit(lambda p, batch: model.apply({"params": p}, *(batch[k] for k in tasks.INPUTS)))
    rows = {k: v[:args.eval_rows] for k, v in arrays.items()}
    cuts = {"padded": (), "bucketed": buckets}

    def evaluate(cut):
        return trainer.batched_outputs(step, params, rows, tasks.INPUTS, args.eval_batch,
                                       bucket_lengths=cut)
    # The untimed first turn compiles every shape.
    best = harness.time_in_turns({name: functools.partial(evaluate, cut)
                                  for name, cut in cuts.items()},
                                 warmup=1, steps=1, repeats=args.repeats)
    return {name: len(rows["input_ids"]) / best[name] for name in cuts}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--buckets", default="16,32,48,64,96")
    parser.add_argument("--examples_per_row", type=int, default=16)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--eval_rows", type=int, default=0)
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--size", default="mini")
    args = parser.parse_args()
    buckets = tuple(int(b) for b in args.buckets.split(","))
    bench = harness.start(args)
    tokenizer = wordpiece()
    sets = {"VADER movie snippets": [TextExample(str(i), text, label=score)
                                     for i, (text, score) in enumerate(
                                         real_data.vader_movie_snippets())],
            "Austen sentence pairs": [TextExample(str(i), a, b, label=score) for i, (a, b, score)
                                      in enumerate(real_data.austen_pairs(2000))]}
    table = bench.table(f"real tokens per row: max_seq_length {args.max_seq_length}, batch "
                        f"{args.batch}, buckets {buckets}, up to {args.examples_per_row} examples "
                        "per packed row", [("data", ""), ("examples", ",d"), ("padded %", ".1f"),
                                           ("bucketed %", ".1f"), ("packed %", ".1f"),
                                           ("packed rows", ",d")])
    for name, examples in sets.items():
        features = classification_features(examples, tokenizer, args.max_seq_length,
                                           regression=True)
        s = shares(features.arrays["input_mask"], args.batch, buckets, args.examples_per_row)
        table.row(name, s["rows"], 100 * s["padded"], 100 * s["bucketed"], 100 * s["packed"],
                  s["packed rows"])
        if name.startswith("VADER"):
            vader = features.arrays
    measured = [(f"training speed, VADER, {args.size}, {args.steps} steps of batch "
                 f"{args.batch} rows", training_speed)] if args.steps else []
    if args.eval_rows:
        measured.append((f"evaluation speed, VADER, {args.size}, {args.eval_rows} rows in "
                         f"batches of {args.eval_batch}", evaluation_speed))
    for heading, speed in measured:
        rates = speed(vader, args, buckets)
        speeds = bench.table(f"{heading}; one {jax.devices()[0].platform} device",
                             [("rows", ""), ("examples/s", ".1f"), ("x padded", ".2f")])
        for name, rate in rates.items():
            speeds.row(name, rate, rate / rates["padded"])
    bench.finish()


if __name__ == "__main__":
    main()
