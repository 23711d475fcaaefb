"""google-research/bert's own `create_pretraining_data.py`, timed: the pipeline benchmark's anchor.

The PyPI package `bert-tensorflow` ships the original script unchanged (TF1 code); it runs
under TensorFlow 2 with `tf.compat.v1` standing in for `tensorflow` while it is imported:

    .venv/bin/python -m pip install bert-tensorflow==1.0.4

`run` writes the documents in the script's input format (a sentence per line, a blank line
between documents), runs the script in its own process (its flags are module globals) and
times its `main`: tokenizing every document once, then `dupe_factor` rounds of pairs +
masks, the shuffle, and writing the TFRecord file. One core: it is plain Python. Run as a
script, this file is that process. `data_pipeline.py` takes its speed, `recipe_vs_original.py`
its instances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

INSTALL = "python -m pip install bert-tensorflow==1.0.4"


def run(documents: list[list[str]], vocab_file: str, output_dir: str, *, max_seq_length: int,
        max_predictions: int, dupe_factor: int, random_seed: int = 12345) -> dict:
    """One run of the original script over `documents` (lists of sentences), lower-cased
    WordPiece: {'instances': written, 'seconds': of its main, 'path': the TFRecord file}."""
    corpus = os.path.join(output_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.writelines("\n".join(sentences) + "\n\n" for sentences in documents)
    path = os.path.join(output_dir, "instances.tfrecord")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f"--input_file={corpus}",
         f"--output_file={path}", f"--vocab_file={vocab_file}", "--do_lower_case=True",
         f"--max_seq_length={max_seq_length}", f"--max_predictions_per_seq={max_predictions}",
         f"--dupe_factor={dupe_factor}", f"--random_seed={random_seed}"],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode:
        raise RuntimeError(f"the original create_pretraining_data.py failed (install it: "
                           f"{INSTALL}):\n{out.stderr[-2000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "path": path}


def instances_per_second(documents: list[list[str]], vocab_file: str, *, max_seq_length: int,
                         max_predictions: int, dupe_factor: int) -> tuple[int, float]:
    """(instances written, instances per second) of one run of the original script."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run(documents, vocab_file, tmp, max_seq_length=max_seq_length,
                     max_predictions=max_predictions, dupe_factor=dupe_factor)
    return result["instances"], result["instances"] / result["seconds"]


def _run_original(argv: list[str]) -> None:
    import tensorflow as tf
    sys.modules["tensorflow"] = tf.compat.v1  # the 2018 script speaks TF1
    from bert import create_pretraining_data as original
    sys.modules["tensorflow"] = tf
    original.FLAGS(argv)
    start = time.perf_counter()
    original.main(None)
    seconds = time.perf_counter() - start
    written = sum(1 for _ in tf.data.TFRecordDataset(original.FLAGS.output_file))
    print(json.dumps({"instances": written, "seconds": seconds}))


if __name__ == "__main__":
    _run_original(sys.argv)
