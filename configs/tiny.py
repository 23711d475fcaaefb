"""A CPU demo in minutes: a 2-layer BERT (H128) pretrained on the embedded Jane Austen corpus.
`make demo` runs the `context` recipe:

  python -m bertjax.prepare --output=/tmp/bertjax-demo/austen
  python -m bertjax.main --config=configs/tiny.py:context --workdir=/tmp/bertjax-demo/run \\
      --config.data.shard_dir=/tmp/bertjax-demo/austen
  python -m bertjax.predict fill-mask --checkpoint=/tmp/bertjax-demo/run/model \\
      --text="She was the youngest of [MASK] two daughters of a most affectionate, indulgent father."

Two recipes, both with bias-corrected AdamW and a short warmup (the original optimizer, without
bias correction, takes steps several times too large in its first thousand or so steps and
relies on the original's 10k-step warmup, longer than these whole runs):

- `quick` (the default, `--config=configs/tiny.py --workdir=DIR`): the original objective and
  model (masked LM + NSP, post-LN, dropout 0.1) for 500 steps at sequence length 128. In a few
  minutes it learns which pieces are frequent, not yet how to use the context.
- `context`: what benchmarks/pretrain_then_finetune.py found gets a model this size past the
  context-free plateau (held-out masked-LM accuracy stays near 0.14, what guessing the most
  frequent piece scores, for about 3,000 steps, then climbs within 500): sequence length 64,
  masked LM only, pre-LN, no dropout, lr 1e-3 for 4,500 steps. About 5 minutes on 2 CPU cores.
"""

from bertjax.training import pretrain_config

RECIPES = ("quick", "context")


def get_config(recipe: str = "quick"):
    if recipe not in RECIPES:
        raise ValueError(f"configs/tiny.py recipe {recipe!r}: expected one of "
                         f"{', '.join(RECIPES)}")
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
    if recipe == "context":
        config.data.max_seq_length = 64
        config.data.max_predictions_per_seq = 10
        config.data.nsp = False
        config.model.pre_layer_norm = True
        config.model.hidden_dropout_prob = 0.0
        config.model.attention_probs_dropout_prob = 0.0
        config.optimizer.learning_rate = 1e-3
        config.optimizer.warmup_steps = 300
        config.train.num_steps = 4500
        config.train.log_every = 100
        config.train.eval_every = 500
        config.train.checkpoint_every = 500
    return config
