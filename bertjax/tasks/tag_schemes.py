"""Tag schemes for token tagging (BIO, BIOES): entity spans from tags and tags from spans.

Decoding follows seqeval's default (conlleval-like) mode, the one NER papers report: an
`I-`/`E-` tag that cannot continue the current entity starts a new one instead of being
dropped, and a change of type always closes the current entity. The same decoder serves the
entity-level metrics and the repair of ill-formed training files, so what the model is
trained on is what it is scored on.
"""

from __future__ import annotations

from typing import Iterable, Sequence

SCHEMES = ("BIO", "BIOES")
PREFIXES = frozenset("BIES")

Entity = tuple[str, int, int]  # (type, first index, last index inclusive)


def parse_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''); a bare 'B' has the empty type."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if prefix not in PREFIXES or (sep and not kind):
        raise ValueError(f"tag {tag!r}: expected 'O' or one of B-, I-, E-, S- and a type")
    return prefix, kind


def entities(tags: Sequence[str]) -> list[Entity]:
    """Entity spans of one sentence, decoded leniently (seqeval default mode)."""
    found: list[Entity] = []
    start, prev_prefix, prev_kind = -1, "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = parse_tag(tag)
        if prev_prefix != "O" and (prev_prefix in "ES" or prefix in "BSO" or kind != prev_kind):
            found.append((prev_kind, start, i - 1))
        if prefix != "O" and (prefix in "BS" or prev_prefix in "ESO" or kind != prev_kind):
            start = i
        prev_prefix, prev_kind = prefix, kind
    return found


def to_tags(spans: Iterable[Entity], length: int, scheme: str) -> list[str]:
    """The canonical tag sequence of non-overlapping spans in `scheme`."""
    if scheme not in SCHEMES:
        raise ValueError(f"tag scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    tags = ["O"] * length
    for kind, first, last in spans:
        if scheme == "BIOES" and first == last:
            tags[first] = f"S-{kind}"
            continue
        tags[first] = f"B-{kind}"
        for i in range(first + 1, last + 1):
            tags[i] = f"I-{kind}"
        if scheme == "BIOES":
            tags[last] = f"E-{kind}"
    return tags


def detect_scheme(tags: Iterable[str]) -> str:
    """BIOES if any E- or S- tag occurs, else BIO."""
    return "BIOES" if any(parse_tag(t)[0] in "ES" for t in tags) else "BIO"


def canonical(tags: Sequence[str], scheme: str) -> list[str]:
    """`tags` re-encoded so every entity starts and ends as `scheme` requires; well-formed
    sequences come back unchanged (e.g. BIO 'O I-PER' -> 'O B-PER')."""
    return to_tags(entities(tags), len(tags), scheme)
