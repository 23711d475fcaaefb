"""What a checkpoint reader returns and a writer takes, with the tokenizer files it carries."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from bertjax import files
from bertjax.models.bert import BertConfig

# Tokenizer files carried from one model directory to the next, whatever the format.
TOKENIZER_FILES = ("vocab.txt", "spm.model", "tokenizer_config.json")


@dataclasses.dataclass
class Converted:
    config: BertConfig
    params: dict  # BertForPreTraining params: {'bert': ..., 'mlm': ..., 'nsp': ...}
    fresh: list[str]  # param paths the checkpoint lacked, initialised fresh
    tokenizer_files: list[str]  # carried over as they are
    skipped: list[str] = dataclasses.field(default_factory=list)  # extra heads left out


def tokenizer_files(directory: str) -> list[str]:
    """The tokenizer files in `directory` (local or gs://)."""
    return [str(files.path(directory) / name) for name in TOKENIZER_FILES
            if (files.path(directory) / name).is_file()]


class CopiedTokenizer:
    """Tokenizer files copied as they are, so conversion needs no tokenizer class and changes
    nothing in them; stands in for a bertjax Tokenizer in `checkpoints.save_model`."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def save(self, directory: str) -> list[str]:
        return [str(files.copy_file(p, files.path(directory) / files.path(p).name))
                for p in self.paths]


def check_output(directory: str, overwrite: bool) -> None:
    if files.path(directory).exists() and not overwrite:
        raise FileExistsError(f"{files.path(directory)} already exists (pass --overwrite to "
                              f"replace it)")


@contextlib.contextmanager
def output_directory(directory: str, overwrite: bool, marker: str) -> Iterator[str]:
    """A local directory to write a converted checkpoint in, published as `directory` (local
    or gs://) once complete: `files.staged_directory`, with `marker` the file written last."""
    check_output(directory, overwrite)
    with files.staged_directory(directory, marker) as stage:
        yield str(stage)
