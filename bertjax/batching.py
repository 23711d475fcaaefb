"""The batching contract: how rows of examples become model batches, for pretraining and
fine-tuning alike. Cutting a batch to a length bucket, and packing several examples into a
row, are defined here once, with the names every batch uses.

A batch is a dict of arrays with one row per entry of axis 0:

- `INPUTS`: `input_ids`, `input_mask` (1 on real tokens), `segment_ids`, [R, L]. Positions
  run along axis 1 (`POSITIONS_AXIS`): an array whose axis 1 has the row length L is
  per-position (the inputs, per-token targets such as tagging's `label_ids`), and cutting a
  batch to a bucket cuts exactly those. Outputs the model computes per position come back
  with the same axis, which `untrim` pads back to L.
- Packed rows (several examples a row, `examples_per_row` K > 1) add `PACKING_INPUTS`, what
  the model reads to keep each example apart (models.bert.Packing): `position_ids` [R, L]
  (restarting at 0 for each example), `example_ids` [R, L] (1, 2, ... per example, 0 on
  padding: who attends to whom) and `cls_positions` [R, K] (each example's first token, its
  [CLS]); and `EXAMPLE_WEIGHTS`, `example_weights` [R, K]: 1 for an example, 0 for an empty
  slot, what per-example losses and counts are weighted by. Per-example targets are [R, K],
  by slot. Every example has the positions, attention and [CLS] it would have alone in its
  row, so a packed batch gives each example its unpacked loss and gradient.

Two packers keep this contract, each where its pipeline runs: `pack_rows` here (NumPy,
best-fit, fine-tuning's rows, which also get `example_index` [R, K], the input row of each
slot, -1 when empty) and its TensorFlow half `data/packing.py` (first-fit inside tf.data,
pretraining's rows, which also move the masked-LM predictions). Bucketing (`bucket_length`,
`trim`, `untrim`) applies to unpacked rows: packed rows are full.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

INPUTS = ("input_ids", "input_mask", "segment_ids")  # what every model reads
MASK = "input_mask"
POSITIONS_AXIS = 1
PACKING_INPUTS = ("position_ids", "example_ids", "cls_positions")
EXAMPLE_WEIGHTS = "example_weights"
# What a packed batch holds besides INPUTS and the targets.
PACKED_ARRAYS = PACKING_INPUTS + (EXAMPLE_WEIGHTS,)


def row_length(batch: dict[str, np.ndarray]) -> int:
    """L: the positions of the batch's rows."""
    return batch[MASK].shape[POSITIONS_AXIS]


def real_lengths(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Real tokens per row, [R]."""
    return batch[MASK].sum(axis=POSITIONS_AXIS)


def bucket_length(batch: dict[str, np.ndarray], bucket_lengths: Sequence[int]) -> int:
    """The shortest of `bucket_lengths` (ascending) that holds every real token of the rows;
    the rows' full length when none does."""
    real_L = batch[MASK].any(axis=0)
    longest = int(np.flatnonzero(real_L)[-1]) + 1 if real_L.any() else 1
    return next((b for b in bucket_lengths if b >= longest), row_length(batch))


def trim(batch: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """The batch's per-position arrays cut to `length` positions."""
    full = row_length(batch)
    return {k: v[:, :length] if v.ndim > POSITIONS_AXIS and v.shape[POSITIONS_AXIS] == full
            else v for k, v in batch.items()}


def untrim(x: np.ndarray, shape: tuple, missing: int) -> np.ndarray:
    """An output of a batch `trim` cut by `missing` positions at the full batch's `shape`:
    its positions axis padded with zeros; outputs without one come back as they are."""
    if x.shape == shape:
        return x
    padded = x
    if x.ndim > POSITIONS_AXIS:
        pad = [(0, 0)] * x.ndim
        pad[POSITIONS_AXIS] = (0, missing)
        padded = np.pad(x, pad)
    if padded.shape != shape:
        raise ValueError(f"an output of shape {x.shape} from a batch cut by {missing} positions "
                         f"is not {shape} once padded: its positions are not axis "
                         f"{POSITIONS_AXIS}")
    return padded


def pack_rows(arrays: dict[str, np.ndarray], targets: Sequence[str],
              max_per_row: int) -> dict[str, np.ndarray]:
    """Padded single-example rows packed into fewer rows of up to `max_per_row` examples:
    INPUTS and the PACKED_ARRAYS of the contract (see the module docstring), plus
    `example_index`. Per-example `targets` ([N]) become [R, K]; per-token `targets` ([N, L],
    -1 where there is nothing to predict, as tagging's `label_ids`) move with their tokens
    and are -1 on padding. Rows are filled best-fit, longest example first, so the result
    does not depend on the input order.
    """
    lengths = real_lengths(arrays).astype(np.int64)
    full = row_length(arrays)
    rows: list[list[int]] = []
    space: list[int] = []
    # Rows with room for more examples, by free positions: the best fit is the fullest row
    # the example fits in.
    by_space: dict[int, list[int]] = {}
    for i in np.argsort(-lengths, kind="stable"):
        need = int(lengths[i])
        row = next((by_space[free].pop() for free in range(need, full + 1)
                    if by_space.get(free)), None)
        if row is None:
            row = len(rows)
            rows.append([])
            space.append(full)
        rows[row].append(int(i))
        space[row] -= need
        if len(rows[row]) < max_per_row:
            by_space.setdefault(space[row], []).append(row)
    count = len(rows)
    out = {k: np.zeros((count, full), np.int32)
           for k in (*INPUTS, "position_ids", "example_ids")}
    out["cls_positions"] = np.zeros((count, max_per_row), np.int32)
    out[EXAMPLE_WEIGHTS] = np.zeros((count, max_per_row), np.float32)
    out["example_index"] = np.full((count, max_per_row), -1, np.int64)
    per_token = [key for key in targets if arrays[key].ndim == 2]
    for key in targets:
        shape = (count, full) if key in per_token else (count, max_per_row)
        out[key] = np.full(shape, -1 if key in per_token else 0, arrays[key].dtype)
    for r, members in enumerate(rows):
        start = 0
        for slot, i in enumerate(sorted(members)):
            n = int(lengths[i])
            span = slice(start, start + n)
            out["input_ids"][r, span] = arrays["input_ids"][i, :n]
            out["segment_ids"][r, span] = arrays["segment_ids"][i, :n]
            out["input_mask"][r, span] = 1
            out["position_ids"][r, span] = np.arange(n)
            out["example_ids"][r, span] = slot + 1
            out["cls_positions"][r, slot] = start
            out[EXAMPLE_WEIGHTS][r, slot] = 1.0
            out["example_index"][r, slot] = i
            for key in targets:
                if key in per_token:
                    out[key][r, span] = arrays[key][i, :n]
                else:
                    out[key][r, slot] = arrays[key][i]
            start += n
    return out
