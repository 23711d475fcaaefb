"""Directory plumbing for conversion: atomic output directories and tokenizer files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid

# Tokenizer files carried from one model directory to the next, whatever the format.
TOKENIZER_FILES = ("vocab.txt", "spm.model", "tokenizer_config.json")


def tokenizer_files(directory: str) -> list[str]:
    return [os.path.join(directory, f) for f in TOKENIZER_FILES
            if os.path.isfile(os.path.join(directory, f))]


class CopyTokenizer:
    """Stands in for a bertjax Tokenizer in `checkpoints.save_model`: copies the files as they
    are, so conversion needs no tokenizer class and changes nothing in them."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def save(self, directory: str) -> list[str]:
        return [shutil.copy(p, os.path.join(directory, os.path.basename(p))) for p in self.paths]


def check_output(directory: str, overwrite: bool) -> str:
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not overwrite:
        raise FileExistsError(f"{directory} already exists (pass --overwrite to replace it)")
    return directory


@contextlib.contextmanager
def atomic_directory(directory: str, overwrite: bool):
    """Yields a temporary sibling of `directory` that is renamed into place on success."""
    directory = check_output(directory, overwrite)
    tmp = f"{directory}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        yield tmp
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
