"""Synthetic pretraining batches with learnable structure, and a small test config.

Each sequence is [CLS] A [SEP] B [SEP] [PAD]... where A repeats one word (uniform over 20)
and B repeats the same word, unless the NSP label is 1 and B repeats another: a masked token
is a copy of its neighbours (MLM is learnable) and so is the NSP label. Rows depend only on (seed, step,
global row), so any number of processes can each build their own rows of the same batch.
"""

from __future__ import annotations

import numpy as np

from bertjax.training import pretrain, pretrain_config

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_WORD = 5
WORDS = 20  # of the vocabulary's 101 non-special ids: guessing is right 5% of the time


def synthetic_row(seed: int, step: int, row: int, seq_len: int, predictions: int,
                  vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, step, row])
    length = int(rng.integers(seq_len - 3, seq_len + 1)) - 3  # text tokens; some rows padded
    len_a = int(rng.integers(1, length))
    word_a, word_b = FIRST_WORD + rng.choice(WORDS, size=2, replace=False)
    label = int(rng.integers(0, 2))
    a = np.full(len_a, word_a)
    b = np.full(length - len_a, word_a if label == 0 else word_b)
    ids = np.concatenate([[CLS], a, [SEP], b, [SEP]]).astype(np.int32)
    segments = np.concatenate([np.zeros(len_a + 2), np.ones(len(b) + 1)]).astype(np.int32)
    text_positions = np.concatenate([np.arange(1, len_a + 1),
                                     np.arange(len_a + 2, len_a + 2 + len(b))])
    count = int(rng.integers(1, predictions + 1))  # rows differ in how many they predict
    chosen = np.sort(rng.choice(text_positions, size=count, replace=False))
    out = {
        "input_ids": np.full(seq_len, PAD, np.int32),
        "input_mask": np.zeros(seq_len, np.int32),
        "segment_ids": np.zeros(seq_len, np.int32),
        "masked_lm_positions": np.zeros(predictions, np.int32),
        "masked_lm_ids": np.zeros(predictions, np.int32),
        "masked_lm_weights": np.zeros(predictions, np.float32),
        "next_sentence_labels": np.asarray(label, np.int32),
    }
    out["input_ids"][:len(ids)] = ids
    out["input_mask"][:len(ids)] = 1
    out["segment_ids"][:len(ids)] = segments
    out["masked_lm_positions"][:count] = chosen
    out["masked_lm_ids"][:count] = ids[chosen]
    out["masked_lm_weights"][:count] = 1.0
    out["input_ids"][chosen] = MASK
    return out


def synthetic_batch(seed, step, rows, seq_len, predictions, vocab):
    examples = [synthetic_row(seed, step, r, seq_len, predictions, vocab) for r in rows]
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


class SyntheticIterator:
    def __init__(self, config, start_position, process_index=0, process_count=1):
        self.config = config
        self.step = (start_position or {"step": 0})["step"]
        local = config.train.global_batch_size // process_count
        self.rows = range(process_index * local, (process_index + 1) * local)

    def __iter__(self):
        return self

    def __next__(self):
        c = self.config
        batch = synthetic_batch(c.seed, self.step, self.rows, c.data.max_seq_length,
                                c.data.max_predictions_per_seq, VOCAB)
        self.step += 1
        return batch

    def position(self):
        return {"step": self.step}


VOCAB = 106


def synthetic_data(config, process_index=0, process_count=1, eval_batches=2):
    def eval_data():
        c = config
        local = c.train.global_batch_size // process_count
        rows = range(process_index * local, (process_index + 1) * local)
        return [synthetic_batch(c.seed + 1000, i, rows, c.data.max_seq_length,
                                c.data.max_predictions_per_seq, VOCAB)
                for i in range(eval_batches)]
    return pretrain.PretrainingData(
        vocab_size=VOCAB,
        train=lambda pos: SyntheticIterator(config, pos, process_index, process_count),
        eval=eval_data)


def tiny_config(**train_overrides):
    """The tests' standard run: a 1-layer model of odd sizes (hidden 36, 2 heads, mlp 38,
    vocab 106), batch 16 of length 13, 6 steps. Tests that change only what the host does
    (logging, evaluation and checkpoint cadence, the data) share its compiled programs through
    the compilation cache; the model, batch, mesh and num_steps (in the schedule) do not."""
    config = pretrain_config.defaults("tiny")
    config.quiet = True
    m = config.model
    m.num_hidden_layers, m.hidden_size = 1, 36
    m.num_attention_heads, m.intermediate_size = 2, 38
    d = config.data
    d.max_seq_length, d.max_predictions_per_seq = 13, 3
    o = config.optimizer
    # The original optimizer (no bias correction) needs the original's long warmup; these
    # runs are a few hundred steps at most.
    o.name, o.learning_rate, o.warmup_steps, o.schedule = "adamw", 1e-2, 10, "warmup_linear"
    t = config.train
    t.global_batch_size, t.num_steps, t.log_every = 16, 6, 1
    t.checkpoint_every, t.keep_checkpoints = 1000, 2
    t.peak_flops_per_device = 1e9
    t.evaluate = "eval_every" in train_overrides  # evaluation when a test sets its interval
    for k, v in train_overrides.items():
        setattr(t, k, v)
    return config


def multiprocess_config(mesh_shape=(2, 2, 1)):
    """Shared by the multi-process test and its driver: (data 2, fsdp 2) over 2 processes."""
    config = tiny_config(checkpoint_every=2, eval_every=3)
    config.mesh.shape = mesh_shape
    return config
