"""Checkpoint conversion between bertjax model directories, Hugging Face and original TF BERT.

    python -m bertjax.convert --from=hf --input=HF_DIR --output=MODEL_DIR
    python -m bertjax.convert --from=tf --input=GOOGLE_BERT_DIR --output=MODEL_DIR
    python -m bertjax.convert --to=hf --input=MODEL_DIR --output=HF_DIR
    python -m bertjax.convert --to=tf --input=MODEL_DIR --output=TF_DIR

Conversion is the rename table in `table.py` plus reshapes; see `params.py` for the checks.
Inputs and outputs may be local or gs:// paths: every file goes through `bertjax.files`.
"""

from __future__ import annotations

import sys

from bertjax import files
from bertjax.convert import result
from bertjax.convert.params import Log
from bertjax.convert.result import Converted
from bertjax.models.heads import BertForPreTraining, param_shapes
from bertjax.models.seq2seq import Bert2Bert, is_tied
from bertjax.training import checkpoints

FORMATS = ("bertjax", "hf", "tf")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def read_bertjax(path: str) -> Converted:
    """A model directory, or a workdir that holds a model (see `checkpoints.open_model`)."""
    source = checkpoints.open_model(path)
    # A model directory holding a decoder is a Bert2Bert (a converted EncoderDecoderModel or
    # a fine-tuned seq2seq model).
    stored = source.param_metadata()
    model = (Bert2Bert(source.config, tie_encoder_decoder=is_tied(stored))
             if "decoder" in stored else BertForPreTraining(source.config))
    params = source.load_params(checkpoints.on_first_device(param_shapes(model)))
    return Converted(source.config, params, [], result.tokenizer_files(source.tokenizer_dir))


def write_bertjax(directory: str, converted: Converted, overwrite: bool = False,
                  log: Log = print) -> str:
    log(f"writing the model directory {directory}")
    return checkpoints.save_model(directory, converted.params, converted.config,
                                  result.CopiedTokenizer(converted.tokenizer_files), overwrite)


def read(fmt: str, path: str, seed: int = 0, log: Log = print, strict: bool = False) -> Converted:
    """The checkpoint at `path` in format `fmt`. Tensors of heads bertjax does not have (task
    classifiers) are skipped and listed in `.skipped`, or refused if `strict`."""
    from bertjax.convert import hf, tf
    if not files.path(path).exists() and not files.path(path + ".index").exists():
        raise FileNotFoundError(f"{path}: no such directory")
    if fmt == "hf":
        return hf.read_hf(path, seed, log, strict)
    if fmt == "tf":
        return tf.read_tf(path, seed, log, strict)
    if fmt == "bertjax":
        return read_bertjax(path)
    raise ValueError(f"unknown checkpoint format {fmt!r}: expected one of {FORMATS}")


def write(fmt: str, path: str, converted: Converted, overwrite: bool = False,
          log: Log = print) -> str:
    from bertjax.convert import hf, tf
    writers = {"hf": hf.write_hf, "tf": tf.write_tf, "bertjax": write_bertjax}
    if fmt not in writers:
        raise ValueError(f"unknown checkpoint format {fmt!r}: expected one of {FORMATS}")
    return writers[fmt](path, converted, overwrite, log)


def convert(input_path: str, output_path: str, src: str = "bertjax", dst: str = "bertjax",
            seed: int = 0, overwrite: bool = False, log: Log = print,
            warn: Log = _stderr, strict: bool = False) -> Converted:
    """Reads `input_path` in format `src`, writes `output_path` in format `dst`. Parts the
    input lacks (heads, pooler) are initialised fresh with `seed`, and heads bertjax does not
    have are left out (refused if `strict`); both are reported via `warn`."""
    if src == dst:
        raise ValueError(f"--from and --to are both {src!r}: nothing to convert")
    result.check_output(output_path, overwrite)
    converted = read(src, input_path, seed, log, strict)
    if converted.skipped:
        warn(f"warning: {input_path} has heads bertjax does not convert; left out (--strict "
             f"refuses them): " + ", ".join(converted.skipped))
    if converted.fresh:
        warn(f"warning: {input_path} lacks these tensors; initialised fresh (seed {seed}): "
             + ", ".join(converted.fresh))
    if not converted.tokenizer_files:
        warn(f"warning: no tokenizer file ({', '.join(result.TOKENIZER_FILES)}) in "
             f"{input_path}; the output has none")
    write(dst, output_path, converted, overwrite, log)
    log(f"done: {output_path}")
    return converted
