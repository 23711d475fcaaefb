"""A CPU demo in a few minutes: a 2-layer BERT (H128) pretrained on the embedded Jane Austen
corpus. `make demo` runs exactly this:

  python -m bertjax.prepare --output=/tmp/bertjax-demo/austen
  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/bertjax-demo/run \\
      --config.data.shard_dir=/tmp/bertjax-demo/austen
  python -m bertjax.predict fill-mask --checkpoint=/tmp/bertjax-demo/run/model \\
      --text="It is a truth universally [MASK] that a single man in possession of a good \\
fortune must be in want of a wife."

It uses bias-corrected AdamW with a short warmup: the original optimizer (no bias correction)
takes steps several times too large in its first thousand or so steps and relies on the
original's 10k-step warmup, longer than this whole run.
"""

from bertjax.training import pretrain_config


def get_config():
    config = pretrain_config.defaults("tiny")
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.heldout_fraction = 0.02
    config.optimizer.name = "adamw"
    config.optimizer.schedule = "warmup_linear"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 50
    config.train.global_batch_size = 32
    config.train.num_steps = 500
    config.train.log_every = 25
    config.train.eval_every = 250
    config.train.eval_batches = 8
    config.train.checkpoint_every = 250
    return config
