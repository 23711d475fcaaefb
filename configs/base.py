"""BERT-base (L12/H768/A12, 110M parameters), the original recipe in two phases.

Phase 1: 900k steps at sequence length 128 (20 predictions), batch 256. Phase 2: 100k steps
at length 512 (80 predictions), starting from phase 1's parameters with a fresh optimizer
and warmup, as the original does with --init_checkpoint. AdamW without bias correction, lr
1e-4, 10k warmup steps, linear decay, weight decay 0.01, clip 1.0; 15% masking, NSP on.

  python -m bertjax.prepare --input='corpus/*.txt' \\
      --tokenizer=uncased_L-12_H-768_A-12/vocab.txt --output=gs://BUCKET/corpus
  python -m bertjax.main --config=configs/base.py --workdir=gs://BUCKET/base-phase1 \\
      --config.data.shard_dir=gs://BUCKET/corpus
  python -m bertjax.main --config=configs/base.py:phase2 --workdir=gs://BUCKET/base-phase2 \\
      --config.data.shard_dir=gs://BUCKET/corpus --config.init_checkpoint=gs://BUCKET/base-phase1

On a TPU pod or GPU nodes, run the same command through `launch/` (see launch/README.md).
Compute is bfloat16 on GPUs and TPUs, float32 on CPUs (model.dtype=auto; parameters stay
float32). Restarts after a preemption reuse compiled programs with
--config.train.compilation_cache_dir=gs://BUCKET/jax-cache. Large global batches:
--config.optimizer.name=lamb with a higher learning rate (e.g. 8k sequences, lr 1.76e-3).
"""

from bertjax.training import pretrain_config


def get_config(phase: str = "phase1"):
    return pretrain_config.original_recipe("base", phase)
