"""Single-sentence classification (SST-2 style), the original recipe: batch 32, lr 5e-5,
3 epochs, 10% warmup.

  python -m bertjax.main --config=configs/finetune/classify.py --workdir=/tmp/sst2 \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=SST-2/train.tsv --config.task.eval_files=SST-2/dev.tsv

CKPT (`init_checkpoint`) is a model directory (`python -m bertjax.convert --from=hf
--input=<Hugging Face BERT dir> --output=/tmp/minilm`) or a bertjax pretraining workdir.
Files are GLUE-style TSVs with a header (columns `sentence`, `label`); CSV and JSONL work
the same way (`task.text_columns`, `task.label_column`, `task.format`). Or a prepared TFDS
dataset: --config.task.tfds_name=glue/sst2. Predict afterwards with
`python -m bertjax.predict classify --checkpoint=/tmp/sst2 --text="..."` (or
`--input=test.tsv --output=predictions.jsonl`).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("classification")
    config.task.text_columns = ("sentence",)
    config.task.label_column = "label"
    config.task.max_seq_length = 128
    return config
