"""Sentence-pair classification (MRPC, QNLI, RTE, MNLI style) or, with
--config.task.type=regression, a similarity score (STS-B: one output, mean squared error).

  python -m bertjax.main --config=configs/finetune/pair.py --workdir=/tmp/mrpc \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=MRPC/train.tsv --config.task.eval_files=MRPC/dev.tsv \\
      --config.task.text_columns="('#1 String', '#2 String')" --config.task.label_column=Quality

  python -m bertjax.main --config=configs/finetune/pair.py --workdir=/tmp/stsb \\
      --config.init_checkpoint=/tmp/minilm --config.task.type=regression \\
      --config.task.tfds_name=glue/stsb

The pair is packed as `[CLS] A [SEP] B [SEP]` with segment ids 0 then 1; an over-long pair
loses tokens from the end of the longer text, as in the original. Predict afterwards with
`python -m bertjax.predict classify --checkpoint=/tmp/mrpc --text=$'She came.\\tShe arrived.'`
(a TAB separates the pair).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("classification")
    config.task.text_columns = ("sentence1", "sentence2")
    config.task.label_column = "label"
    config.task.max_seq_length = 128
    return config
