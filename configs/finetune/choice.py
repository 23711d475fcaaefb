"""Multiple choice (SWAG style): a context and four candidate endings, as the BERT paper
fine-tuned SWAG (lr 2e-5, batch 16, 3 epochs): each candidate is scored on its own row and a
softmax over the four picks one.

  python -m bertjax.main --config=configs/finetune/choice.py --workdir=/tmp/swag \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=swag/train.csv --config.task.eval_files=swag/val.csv

The columns are SWAG's own CSV files': `sent1` (the context), `sent2` (put before every
ending), `ending0`..`ending3` and `label` (the right ending's index); other layouts name
theirs (`task.context_column`, `task.question_column`, `task.choice_columns`,
`task.label_column`; TSV and JSONL read the same way). Predict afterwards with
`python -m bertjax.predict choose --checkpoint=/tmp/swag --text=$'She opened the
door.\\tShe walked in.\\tThe door ate lunch.'` (TABs separate the context and the candidates).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("multiple_choice")
    config.task.question_column = "sent2"
    config.optimizer.learning_rate = 2e-5
    config.train.global_batch_size = 16
    return config
