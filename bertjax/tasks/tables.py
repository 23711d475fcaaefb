"""Tables of examples (TSV, CSV, JSONL, prepared TFDS datasets) as the tasks that read them
share them: the `task` keys that name the columns, and the rows, each with where it came from
(`file:line`) for messages.

GLUE-style TSV is read with no quoting at all (as the GLUE files are written), CSV with
standard quoting, JSONL as one object per line whose keys are the columns. Columns are header
names, or 0-based positions (the only choice when a file has no header).
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Iterator, Sequence

from bertjax import files

FORMATS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}

Column = str | int


def settings() -> dict[str, Any]:
    """The `task` keys of tasks that read tables (a task adds its own columns' keys)."""
    return {
        "header": True,  # TSV/CSV files start with a header line of column names
        # Column names (or 0-based positions in files without a header): one text column, or
        # two for sentence pairs.
        "text_columns": ("sentence",),
        "label_column": "label",
    }


def format_of(path: str) -> str | None:
    """The table format a file's extension says, or None."""
    return FORMATS.get(os.path.splitext(path)[1].lower())


def task_format(settings, task_name: str, path: str) -> str:
    """task.format, or the file's extension's; one clear error when it is not a table."""
    fmt = settings.format or format_of(path)
    if fmt not in ("tsv", "csv", "jsonl"):
        raise ValueError(f"{path}: task.type {task_name} reads tsv, csv or jsonl files; set "
                         f"task.format to one of them" + (f", not {fmt}" if fmt else ""))
    return fmt


def column(name: Column, header: bool) -> Column:
    """A configured column: a number names a position in a file without a header."""
    return name if header or not str(name).isdigit() else int(name)


def rows(path: str, fmt: str, columns: Sequence[Column],
         header: bool = True) -> Iterator[tuple[str, dict]]:
    """(`file:line`, {column: value}) for each non-blank row, every column present."""
    if fmt == "jsonl":
        return _json_rows(path, list(columns))
    return _delimited_rows(path, fmt, list(columns), header)


def text(value, where: str, column: Column) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} is {value!r}, expected text")
    return value


def tfds_rows(name: str, split: str, data_dir: str | None):
    """(builder, numpy rows) of a prepared TFDS dataset; a clear error if it is not there."""
    import tensorflow_datasets as tfds  # only for users who read TFDS

    builder = tfds.builder(name, data_dir=data_dir)
    try:
        dataset = builder.as_dataset(split=split)
    except AssertionError:
        raise FileNotFoundError(
            f"TFDS dataset {name} is not prepared under {builder.data_dir}: build it where "
            f"there is internet (`tfds build {name}`) and pass its data_dir") from None
    return builder, tfds.as_numpy(dataset)


def _delimited_rows(path: str, fmt: str, columns: list[Column], header: bool):
    if fmt not in ("tsv", "csv"):
        raise ValueError(f"format {fmt!r}: expected one of tsv, csv, jsonl")
    name = os.path.basename(path)
    dialect = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv" else {}
    with io.StringIO(files.read_text(path), newline="") as f:
        reader = csv.reader(f, **dialect)
        names = None
        for row in reader:
            if not any(field.strip() for field in row):
                continue
            if names is None:
                names = row if header else [str(i) for i in range(len(row))]
                index = _column_index(path, names, columns, header)
                if header:
                    continue
            if len(row) != len(names):
                raise ValueError(f"{path}:{reader.line_num}: {len(row)} fields, expected "
                                 f"{len(names)} ({'as the header' if header else 'as line 1'})")
            yield f"{name}:{reader.line_num}", {c: row[i] for c, i in index.items()}


def _column_index(path: str, names: list[str], columns: list[Column], header: bool) -> dict:
    index = {}
    for c in columns:
        if isinstance(c, int) and 0 <= c < len(names):
            index[c] = c
        elif header and c in names:
            index[c] = names.index(c)
        else:
            has = (f"columns {names}" if header
                   else f"no header, so name columns by position 0..{len(names) - 1}")
            raise ValueError(f"{path}: no column {c!r}; it has {has}")
    return index


def _json_rows(path: str, columns: list[Column]):
    name = os.path.basename(path)
    with io.StringIO(files.read_text(path)) as f:
        for line_num, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_num}: not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{line_num}: expected a JSON object per line")
            missing = [c for c in columns if c not in obj]
            if missing:
                raise ValueError(f"{path}:{line_num}: no column {missing[0]!r}; it has "
                                 f"columns {sorted(obj)}")
            yield f"{name}:{line_num}", obj
