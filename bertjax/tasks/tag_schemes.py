"""Tag sets for token tagging: what kind a file's tags are, and for the two kinds whose tags
encode spans, the spans from tags and tags from spans.

Three kinds (`task.scheme`): `entity` tags mark spans in BIO or BIOES (NER, chunks), `plain`
tags are classes of their own (part of speech, any `token label`), and `segmentation` tags mark
where words begin and end in character tagging (BMES or BIES, no types: Chinese word
segmentation). A file's kind is detected from its tags unless given.

Entity decoding follows seqeval's default (conlleval-like) mode, the one NER papers report: an
`I-`/`E-` tag that cannot continue the current entity starts a new one instead of being
dropped, and a change of type always closes the current entity. The same decoder serves the
entity-level metrics and the repair of ill-formed training files, so what the model is
trained on is what it is scored on.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

KINDS = ("entity", "plain", "segmentation")
SCHEMES = ("BIO", "BIOES")
SEGMENTATION_SCHEMES = {"BMES": frozenset("BMES"), "BIES": frozenset("BIES")}
SEGMENTATION_TAGS = frozenset("BMEIS")
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


def is_entity_tag(tag: str) -> bool:
    try:
        parse_tag(tag)
    except ValueError:
        return False
    return True


def detect_kind(tags: Iterable[str]) -> str:
    """'segmentation' for bare B/M/E/S (or B/I/E/S) tags, 'entity' when every tag is 'O' or a
    B-/I-/E-/S- tag, else 'plain' (see `mixed_kinds` for files that hold both)."""
    distinct = set(tags)
    if distinct and any(distinct <= letters for letters in SEGMENTATION_SCHEMES.values()):
        return "segmentation"
    return "entity" if all(is_entity_tag(t) for t in distinct) else "plain"


def mixed_kinds(tags: Sequence[str]) -> tuple[int, int] | None:
    """(index of an entity tag with a type, index of a tag that is no entity tag) when `tags`
    hold both, which no single kind reads: a tagging file that mixes them is broken."""
    typed = next((i for i, t in enumerate(tags) if "-" in t and is_entity_tag(t)), None)
    other = next((i for i, t in enumerate(tags) if not is_entity_tag(t)), None)
    return None if typed is None or other is None else (typed, other)


def segmentation_scheme(tags: Iterable[str]) -> str:
    """BIES if an I tag occurs, else BMES; raises on any other tag or on both M and I."""
    distinct = set(tags)
    if not distinct <= SEGMENTATION_TAGS or {"M", "I"} <= distinct:
        shown = ", ".join(map(repr, sorted(distinct - SEGMENTATION_TAGS) or ["M", "I"]))
        raise ValueError(f"segmentation tags {shown}: expected B, M, E, S (or B, I, E, S, "
                         f"one scheme per file)")
    return "BIES" if "I" in distinct else "BMES"


def word_spans(tags: Sequence[str]) -> list[tuple[int, int]]:
    """[first, last) character spans of the words that segmentation tags mark, decoded
    leniently: a word begins at B or S and after E or S, whatever comes between."""
    spans, start = [], 0
    for i in range(1, len(tags) + 1):
        if i == len(tags) or tags[i] in "BS" or tags[i - 1] in "ES":
            spans.append((start, i))
            start = i
    return spans


def segmentation_tags(lengths: Iterable[int], scheme: str = "BMES") -> list[str]:
    """The tag of every character of words `lengths` long."""
    middle = "M" if scheme == "BMES" else "I"
    tags = []
    for n in lengths:
        tags += ["S"] if n == 1 else ["B"] + [middle] * (n - 2) + ["E"]
    return tags


def _segmentation_moves(labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over LABELS: which tags may start a sentence, follow each tag, and end a sentence
    (a word is S alone, or B, any number of M or I, then E; any other label never)."""
    kind = {t: t if t in "BES" else "M" for t in labels if t in SEGMENTATION_TAGS}
    start = np.array([kind.get(t) in ("B", "S") for t in labels])
    end = np.array([kind.get(t) in ("E", "S") for t in labels])
    follows = {"B": "ME", "M": "ME", "E": "BS", "S": "BS"}
    allowed = np.array([[a in kind and b in kind and kind[b] in follows[kind[a]]
                         for b in labels] for a in labels])
    return start, allowed, end


def best_segmentation(log_probs_WC: np.ndarray, labels: Sequence[str]) -> list[str]:
    """The most probable sequence of segmentation tags that spells whole words (Viterbi over
    the per-character log-probabilities `log_probs_WC` of LABELS): an argmax per character can
    give B B or M S, which the lenient span reading then cuts into extra words."""
    if len(log_probs_WC) == 0:
        return []
    start, allowed, end = _segmentation_moves(labels)
    forbidden = np.float32(-1e9)
    transition = np.where(allowed, 0.0, forbidden)
    score = np.where(start, log_probs_WC[0], forbidden)
    back = []
    for row in log_probs_WC[1:]:
        total = score[:, None] + transition  # [from, to]
        back.append(np.argmax(total, axis=0))
        score = total.max(axis=0) + row
    tag = int(np.argmax(np.where(end, score, forbidden)))
    path = [tag]
    for pointers in reversed(back):
        tag = int(pointers[tag])
        path.append(tag)
    return [labels[i] for i in reversed(path)]
