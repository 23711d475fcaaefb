"""Named model sizes: layers L and hidden H; heads = H/64, intermediate = 4H, as in BERT.

The config files read `sizes` through pretrain_config, and the launchers load those files to
check a run before starting it: so this module imports no JAX or Flax until `preset`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertjax.models.bert import BertConfig

SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


def sizes(name: str) -> dict[str, int]:
    """The size fields of a named preset, in BertConfig's names."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}: expected one of {', '.join(SIZES)}")
    layers, hidden = SIZES[name]
    return dict(num_hidden_layers=layers, hidden_size=hidden,
                num_attention_heads=hidden // 64, intermediate_size=4 * hidden)


def preset(name: str, **overrides) -> BertConfig:
    """The BertConfig of a named size; `overrides` replace any field (e.g. vocab_size)."""
    from bertjax.models.bert import BertConfig
    return BertConfig(**{**sizes(name), **overrides})
