"""BERT-large (L24/H1024/A16, 340M parameters), the original recipe in two phases.

As configs/base.py: phase 1 is 900k steps at length 128, phase 2 is 100k steps at length 512
from phase 1's parameters; batch 256, original AdamW, lr 1e-4, 10k warmup.

  python -m bertjax.prepare --input='corpus/*.txt' \\
      --tokenizer=uncased_L-12_H-768_A-12/vocab.txt --output=gs://BUCKET/corpus
  python -m bertjax.main --config=configs/large.py --workdir=gs://BUCKET/large-phase1 \\
      --config.data.shard_dir=gs://BUCKET/corpus
  python -m bertjax.main --config=configs/large.py:phase2 --workdir=gs://BUCKET/large-phase2 \\
      --config.data.shard_dir=gs://BUCKET/corpus --config.init_checkpoint=gs://BUCKET/large-phase1

Compute is bfloat16 on GPUs and TPUs, float32 on CPUs (model.dtype=auto).

Phase 2 at length 512 needs activation memory: add --config.model.remat=True, or
--config.optimizer.grad_accum_steps=N to run the 256 sequences as N micro-batches. To shard
parameters and optimizer state over the devices (FSDP): --config.mesh.shape='(1,-1,1)'.
"""

from bertjax.training import pretrain_config


def get_config(phase: str = "phase1"):
    return pretrain_config.original_recipe("large", phase)
