"""Text-to-text generation with BERT2BERT (Rothe et al. 2020): encoder and decoder both
warm-started from one BERT checkpoint, cross-attention fresh; teacher forcing with the
original fine-tuning optimizer, evaluation by beam search (4 beams) scored with BLEU, chrF
and ROUGE-L.

  python -m bertjax.main --config=configs/finetune/seq2seq.py --workdir=/tmp/paraphrase \\
      --config.init_checkpoint=/tmp/minilm \\
      --config.task.train_file=train.tsv --config.task.eval_files=dev.tsv

CKPT (`init_checkpoint`) is a model directory (`python -m bertjax.convert --from=hf
--input=<Hugging Face BERT dir> --output=/tmp/minilm`) or a bertjax pretraining workdir.
Files are TSVs with a header `source<TAB>target` (CSV and JSONL alike; a headerless TSV:
--config.task.header=false --config.task.text_columns=0 --config.task.label_column=1). A
prepared TFDS dataset instead, its source and target features named:

  python -m bertjax.main --config=configs/finetune/seq2seq.py --workdir=/tmp/gigaword \
      --config.init_checkpoint=/tmp/minilm --config.task.tfds_name=gigaword \
      --config.task.text_columns=document --config.task.label_column=summary

Predictions go to WORKDIR/predictions/<set>.jsonl. Generate afterwards with
`python -m bertjax.predict generate --checkpoint=/tmp/paraphrase --text="..."` (or
`--input=test.tsv --text_columns=source --output=predictions.jsonl`).
"""

from bertjax.training import finetune_config


def get_config():
    config = finetune_config.defaults("seq2seq")
    config.task.text_columns = ("source",)
    config.task.label_column = "target"
    config.task.max_seq_length = 128
    config.task.max_target_length = 64
    config.task.num_beams = 4
    config.task.label_smoothing = 0.1
    config.optimizer.learning_rate = 5e-5
    config.train.num_epochs = 3.0
    return config
