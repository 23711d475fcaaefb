"""What a checkpoint reader returns and a writer takes."""

from __future__ import annotations

import dataclasses

from bertjax.models.bert import BertConfig


@dataclasses.dataclass
class Converted:
    config: BertConfig
    params: dict  # BertForPreTraining params: {'bert': ..., 'mlm': ..., 'nsp': ...}
    fresh: list[str]  # param paths the checkpoint lacked, initialised fresh
    tokenizer_files: list[str]  # carried over as they are
    skipped: list[str] = dataclasses.field(default_factory=list)  # extra heads left out
