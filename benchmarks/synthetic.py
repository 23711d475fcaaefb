"""Synthetic pretraining batches, as the step benchmarks feed every framework: random ids,
sorted masked positions away from the ends, two segments, random next-sentence labels."""

from __future__ import annotations

import numpy as np


def pretraining_batch(batch: int, seq_len: int, predictions: int, vocab: int,
                      seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (batch, seq_len)).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, seq_len - 1), predictions, False))
                          for _ in range(batch)]).astype(np.int32)
    segment = np.zeros((batch, seq_len), np.int32)
    segment[:, seq_len // 2:] = 1
    return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": segment,
            "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(ids, positions, 1),
            "masked_lm_weights": np.ones((batch, predictions), np.float32),
            "next_sentence_labels": rng.integers(0, 2, batch).astype(np.int32)}
