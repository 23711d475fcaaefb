"""Every key of a pretraining config, with its default: the files in configs/ start from here.

Defaults are the original BERT recipe (phase 1 of BERT-base). The model's sizes are concrete
numbers (a preset's, written in by `defaults(size)`), so run_config.json shows what ran. The
loader (`config_flags`, `lock_config=True`) rejects keys that are not listed here, so code
reads `config.x.y` and never guesses; `validate` checks the values before anything runs.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from bertjax.models import presets
from bertjax.training import config_sections as sections


def defaults(size: str = "base") -> ml_collections.ConfigDict:
    """Every key, with the original recipe's values and the sizes of preset `size`."""
    config = ml_collections.ConfigDict()
    config.mode = "pretrain"
    config.seed = 0
    # A model directory (converted or exported) or another pretraining workdir: the run starts
    # from its parameters with a fresh optimizer (continued pretraining, phase 2). Ignored when
    # the workdir already has a checkpoint: the run then resumes from that.
    config.init_checkpoint = placeholder(str)
    config.quiet = False  # no progress lines on the console

    config.model = ml_collections.ConfigDict()
    # None: the tokenizer's vocabulary size (larger rounds the embedding up, e.g. to x128).
    config.model.vocab_size = placeholder(int)
    for key, value in presets.sizes(size).items():  # num_hidden_layers, hidden_size, ...
        config.model[key] = value
    config.model.hidden_act = "gelu"
    config.model.max_position_embeddings = 512
    config.model.pre_layer_norm = False
    sections.model_options(config.model)

    config.data = ml_collections.ConfigDict()
    config.data.shard_dir = placeholder(str)  # output of `python -m bertjax.prepare`
    # None holds out `heldout_fraction` of shard_dir's documents for evaluation instead.
    config.data.eval_shard_dir = placeholder(str)
    config.data.heldout_fraction = 0.01
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15
    config.data.mask_prob = 0.8  # of the chosen positions: [MASK]
    config.data.random_prob = 0.1  # random token; the rest stay unchanged
    config.data.short_seq_prob = 0.1
    config.data.nsp = True
    config.data.whole_word_masking = False
    # Examples are made and shuffled in blocks of documents of about this many tokens.
    config.data.shuffle_tokens = 1 << 19
    # Up to this many examples per row (first-fit, longest first), each attending only to
    # itself with its own positions, predictions and next-sentence label, so rows of short
    # examples (short documents, phase 2 at seq 512) hold text instead of padding. Rows then
    # carry max_predictions_per_seq + examples_per_row prediction slots. 1: as the original.
    config.data.examples_per_row = 1

    config.optimizer = sections.optimizer_section(learning_rate=1e-4)
    config.optimizer.warmup_steps = 10_000

    config.mesh = sections.mesh_section()

    config.train = sections.train_section(global_batch_size=256, log_every=100,
                                          keep_checkpoints=3)
    config.train.num_steps = 1_000_000
    config.train.evaluate = True  # on the held-out batches, every eval_every steps
    config.train.eval_every = 10_000
    config.train.eval_batches = 20
    config.train.checkpoint_every = 10_000
    return config


def validate(config: ml_collections.ConfigDict) -> None:
    """One clear error for the first value that cannot run, before anything starts."""
    train, model, data = config.train, config.model, config.data
    sections.check_train(train, positive=("num_steps", "checkpoint_every", "eval_every",
                                          "eval_batches"))
    sections.check_optimizer(config.optimizer)
    sections.check_model(model)
    if data.max_seq_length > model.max_position_embeddings:
        raise ValueError(f"data.max_seq_length {data.max_seq_length} exceeds "
                         f"model.max_position_embeddings {model.max_position_embeddings}")


# The original two phases: (max_seq_length, max_predictions_per_seq, num_steps).
PHASES = {
    "phase1": (128, 20, 900_000),
    "phase2": (512, 80, 100_000),
}


def original_recipe(size: str, phase: str) -> ml_collections.ConfigDict:
    """The paper's recipe for a model size: 90% of the steps at length 128, then 10% at 512
    (phase 2 starts from phase 1's parameters via init_checkpoint, with a fresh optimizer)."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}: expected one of {', '.join(PHASES)}")
    config = defaults(size)
    seq_len, predictions, steps = PHASES[phase]
    config.data.max_seq_length = seq_len
    config.data.max_predictions_per_seq = predictions
    config.train.num_steps = steps
    config.train.global_batch_size = 256
    return config
