"""Extractive question answering on SQuAD v1.1 (or v2.0 with --config.task.version_2=true),
as the original run_squad: max_seq_length 384, doc_stride 128, max_query_length 64, lr 3e-5,
2 epochs (batch 32 here; the original README used 12 on a GPU, 24 on a TPU); answers by the
n-best span search (n_best 20, max answer length 30).

  python -m bertjax.main --config=configs/finetune/squad.py --workdir=/tmp/squad \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=train-v1.1.json --config.task.eval_files=dev-v1.1.json

WORKDIR/predictions/<set>.answers.json is in the official evaluation script's format. For
v2.0, tune --config.task.null_threshold on the dev set: eval_results.json reports the
best threshold (best_f1_thresh). Predict afterwards with
`python -m bertjax.predict qa --checkpoint=/tmp/squad --text="Who walked?" --context="..."`.
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("squad")
    config.task.max_seq_length = 384
    config.task.doc_stride = 128
    config.task.max_query_length = 64
    config.optimizer.learning_rate = 3e-5
    config.train.num_epochs = 2.0
    return config
