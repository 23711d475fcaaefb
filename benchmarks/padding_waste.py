"""Real tokens per row of fine-tuning batches on real data: padded to max_seq_length (the
original), cut to length buckets (`train.bucket_lengths`), packed (`train.examples_per_row`).

  PYTHONPATH=.:tests python benchmarks/padding_waste.py
  PYTHONPATH=.:tests python benchmarks/padding_waste.py --max_seq_length=256 --batch=32

The data are the fine-tuning benchmark's short-text sets (tests/real_data.py): the 10,605
VADER movie-review snippets (single sentences) and 2,000 Austen sentence pairs, tokenized
by the MiniLM WordPiece vocabulary as bertjax's classification features. Bucketed batches are
one epoch of the training order (fixed-seed permutation, batch --batch); the share is real
tokens over the positions the steps compute (rows x their length), so it is the fraction of
the encoder's work that is not padding.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import real_data  # tests/: the real-data builders the tests use
from bertjax.tasks.classify import TextExample, classification_features
from bertjax.tasks.features import pack_rows
from bertjax.training import finetune
from task_data import wordpiece


def shares(mask: np.ndarray, batch: int, buckets: tuple[int, ...], per_row: int) -> dict:
    real = int(mask.sum())
    order = finetune.epoch_order(len(mask), 0, 0)
    batches = [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    bucketed = sum(len(rows) * finetune.bucket_length(mask[rows], buckets) for rows in batches)
    kept = sum(int(mask[rows].sum()) for rows in batches)
    packed = pack_rows({"input_mask": mask, "input_ids": mask, "segment_ids": mask}, (),
                       per_row)["input_mask"]
    return {"rows": len(mask), "padded": real / mask.size, "bucketed": kept / bucketed,
            "packed rows": len(packed), "packed": real / packed.size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--buckets", default="16,32,48,64,96")
    parser.add_argument("--examples_per_row", type=int, default=16)
    args = parser.parse_args()
    buckets = tuple(int(b) for b in args.buckets.split(","))
    tokenizer = wordpiece()
    sets = {"VADER movie snippets": [TextExample(str(i), text, label=score)
                                     for i, (text, score) in enumerate(
                                         real_data.vader_movie_snippets())],
            "Austen sentence pairs": [TextExample(str(i), a, b, label=score) for i, (a, b, score)
                                      in enumerate(real_data.austen_pairs(2000))]}
    print(f"command: python {' '.join(sys.argv)}")
    print(f"max_seq_length {args.max_seq_length}, batch {args.batch}, buckets {buckets}, up "
          f"to {args.examples_per_row} examples per packed row")
    print("| data | examples | real tokens per row: padded | bucketed | packed (rows) |")
    print("|---|---:|---:|---:|---:|")
    for name, examples in sets.items():
        features = classification_features(examples, tokenizer, args.max_seq_length,
                                           regression=True)
        s = shares(features.arrays["input_mask"], args.batch, buckets, args.examples_per_row)
        print(f"| {name} | {s['rows']:,} | {100 * s['padded']:.1f}% | "
              f"{100 * s['bucketed']:.1f}% | {100 * s['packed']:.1f}% "
              f"({s['packed rows']:,}) |")


if __name__ == "__main__":
    main()
