"""Building the bertjax parameter tree from named tensors (and back), checked against the table.

Reading goes tensor by tensor, so a big checkpoint is never held twice: a source yields one
array, it is renamed and reshaped, placed on the host CPU, and the next is read. Parts a
checkpoint lacks (`table.OPTIONAL_PARTS`) are initialised with the model's own initialiser;
heads bertjax does not have (outside `table.ENCODER_PREFIXES`) are skipped and listed, or
refused when strict; anything else missing, extra or of the wrong shape is an error naming
the tensor.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

import flax.linen as nn
import jax
import numpy as np

from bertjax.convert import table
from bertjax.models.bert import BertConfig
from bertjax.models.heads import BertForPreTraining, init_params

Log = Callable[[str], None]


class Source(Protocol):
    """Tensors of one checkpoint by (normalised) name, loaded one at a time."""

    path: str

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple: ...

    def get(self, name: str) -> np.ndarray: ...

    def label(self, name: str) -> str:
        """The name as the file spells it, for messages."""


def check_convertible(config: BertConfig) -> None:
    if config.pre_layer_norm:
        raise ValueError("pre_layer_norm=True models have no original TF / Hugging Face BERT "
                         "equivalent (both are post-LN); they cannot be converted")


def abstract_params(config: BertConfig, sharding=None, model: nn.Module | None = None) -> dict:
    """ShapeDtypeStructs of the params (without the 'params' collection) of `model`,
    `BertForPreTraining` unless given."""
    model = BertForPreTraining(config) if model is None else model
    tree = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        nn.unbox(tree))


def flatten(tree) -> dict:
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def unflatten(flat: dict) -> dict:
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, last = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return tree


def host_device():
    """Where converted params are built: host memory, not an accelerator's."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS leaves out the CPU backend
        return jax.devices()[0]


def init_fresh(model: nn.Module, paths: list[str], seed: int) -> dict:
    """The listed params as a fresh model with this seed would have them; jit lets XLA drop
    the initialisation of everything else, so the rest of a big model is never materialised."""
    if not paths:
        return {}

    def init(rng):
        flat = flatten(nn.unbox(init_params(model, rng)))
        return {p: flat[p] for p in paths}

    with jax.default_device(host_device()):
        return jax.jit(init)(jax.random.PRNGKey(seed))


def _problems(title: str, items: list[str], limit: int = 10) -> str:
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return f"{title}: " + "; ".join(items[:limit]) + more


def read_params(config: BertConfig, source: Source, fmt: str, seed: int = 0,
                log: Log = print, strict: bool = False, model: nn.Module | None = None,
                rows: list[table.Row] | None = None, encoder_prefixes: tuple = ()
                ) -> tuple[dict, list[str], list[str]]:
    """(params, paths initialised fresh, tensors skipped) of `model` (`BertForPreTraining`
    with `table.rows` unless given, with its table `rows`) from a checkpoint in format `fmt`
    ('tf' or 'hf'); raises one error listing every unexpected, misshapen or missing tensor.
    Tensors of heads bertjax does not have (outside `encoder_prefixes`, by default
    `table.ENCODER_PREFIXES`) are skipped (and returned, as the checkpoint names them) unless
    `strict`, which refuses them."""
    check_convertible(config)
    model = BertForPreTraining(config) if model is None else model
    shapes = {path: tuple(x.shape)
              for path, x in flatten(abstract_params(config, model=model)).items()}
    rows = rows or table.rows(config.num_hidden_layers)
    by_name = {row.name(fmt): row for row in rows}
    available = set(source.names())

    extra = available - set(by_name)
    prefixes = encoder_prefixes or table.ENCODER_PREFIXES[fmt]
    heads = set() if strict else {n for n in extra if not n.startswith(prefixes)}
    unexpected = sorted(source.label(n) for n in extra - heads)
    wrong = [f"{source.label(n)} has shape {source.shape(n)}, expected "
             f"{row.shape(fmt, shapes[row.ours])} (bertjax {row.ours})"
             for n, row in by_name.items()
             if n in available and tuple(source.shape(n)) != row.shape(fmt, shapes[row.ours])]
    missing = [row for row in rows if row.name(fmt) not in available]
    absent_parts = {table.optional_part(row.ours) for row in missing} - {None}
    partial = {part for part in absent_parts
               if any(row.name(fmt) in available for row in rows if row.ours.startswith(part))}
    required = [row.name(fmt) for row in missing
                if table.optional_part(row.ours) in (None, *partial)]
    problems = []
    if unexpected:
        title = ("unexpected tensors (not part of a BERT pretraining model; without --strict "
                 "those of other heads are skipped)" if strict else
                 "unexpected tensors in the encoder (the config does not describe them)")
        problems.append(_problems(title, unexpected))
    if wrong:
        problems.append(_problems(f"wrong shapes for the config (hidden_size "
                                  f"{config.hidden_size}, {config.num_attention_heads} heads, "
                                  f"vocab_size {config.vocab_size})", wrong))
    if required:
        problems.append(_problems("missing tensors", required))
    if problems:
        raise ValueError(f"{source.path}: " + ". ".join(problems))

    skipped = sorted(source.label(n) for n in heads)
    device = host_device()
    present = [row for row in rows if row.name(fmt) in available]
    log(f"reading {len(present)} tensors from {source.path}")
    flat = {}
    for row in present:
        x = row.to_ours(source.get(row.name(fmt)), fmt, shapes[row.ours])
        flat[row.ours] = jax.device_put(x.astype(config.param_dtype), device)
    fresh = [row.ours for row in missing]
    if fresh:
        log(f"initialising {', '.join(sorted(absent_parts))} fresh "
            f"(not in the checkpoint, seed {seed})")
        flat.update(init_fresh(model, fresh, seed))
    return unflatten({path: flat[path] for path in shapes}), fresh, skipped


def write_tensors(config: BertConfig, params: dict, fmt: str, log: Log = print,
                  model: nn.Module | None = None, rows: list[table.Row] | None = None
                  ) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) in format `fmt` for every table tensor in `params` (of `model` with its
    table `rows`; `BertForPreTraining` unless given); optional parts that `params` lacks are
    left out (and said so); anything else missing or extra is an error."""
    check_convertible(config)
    flat = flatten(params)
    rows = rows or table.rows(config.num_hidden_layers)
    known = {row.ours for row in rows}
    extra = sorted(set(flat) - known)
    missing = [row.ours for row in rows if row.ours not in flat]
    required = [p for p in missing if table.optional_part(p) is None]
    if extra or required:
        problems = ([_problems("parameters with no original equivalent", extra)] if extra else [])
        problems += [_problems("missing parameters", required)] if required else []
        raise ValueError("cannot convert these params: " + ". ".join(problems))
    expected = flatten(abstract_params(config, model=model))
    wrong = [f"{p} has shape {tuple(flat[p].shape)}, expected {tuple(expected[p].shape)}"
             for p in flat if tuple(flat[p].shape) != tuple(expected[p].shape)]
    if wrong:
        raise ValueError(_problems("params do not match their config", wrong))
    if missing:
        parts = sorted({table.optional_part(p) for p in missing})
        log(f"not written (absent from the params): {', '.join(parts)}")
    for row in rows:
        if row.ours in flat:
            yield row.name(fmt), row.from_ours(jax.device_get(flat[row.ours]), fmt)
