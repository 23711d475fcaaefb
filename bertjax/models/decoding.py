"""Greedy, beam and sampled decoding for `seq2seq.Bert2Bert` and `seq2seq.UniLM`, as one
jittable function.

Every array has its final size from the start (`max_length` positions, the key/value cache
included) and the loop is a `lax.while_loop` that stops when every sequence has ended, so a
batch compiles once whatever the lengths it produces. Greedy and beam search decide as
transformers' `generate` does (the same scores, length penalty, `early_stopping` values and
stopping rules), so their outputs can be compared token for token. Sequences start with
`start_id`, end with `eos_id` (kept) and are filled with `pad_id` after it.

Both models decode through one `step(cache, tokens_B, position) -> (logits_BV, cache)`: for
BERT2BERT the cache is the decoder's keys and values; for the one stack it is the rows
themselves, `[CLS] source [SEP] target so far [MASK]`, which each step runs whole (UniLM
decodes by appending: the token chosen replaces the [MASK], a new [MASK] follows it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from bertjax.models.seq2seq import Bert2Bert, UniLM

NEG = -1.0e9  # transformers' "impossible" score; kept so ties break the same way


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to decode. max_length counts the start token. early_stopping: True stops a
    sequence's search when it has num_beams finished hypotheses; False when no running beam
    can beat the worst of them at the current length; 'never' at the longest length."""

    start_id: int
    eos_id: int
    pad_id: int
    max_length: int = 32
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    sample: bool = False  # sample instead of taking the most likely token (num_beams 1)
    temperature: float = 1.0
    top_k: int = 0  # sample among the k most likely tokens; 0: all
    top_p: float = 1.0  # sample among the most likely tokens holding this much probability
    mask_id: int = -1  # the one stack's [MASK], the slot it predicts

    def __post_init__(self):
        if self.max_length < 2:
            raise ValueError(f"max_length {self.max_length}: at least 2 (the start token and "
                             f"one generated)")
        if self.num_beams < 1:
            raise ValueError(f"num_beams {self.num_beams}: at least 1")
        if self.sample and self.num_beams != 1:
            raise ValueError("sampling decodes with num_beams 1")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping {self.early_stopping!r}: True, False or 'never'")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"temperature {self.temperature} (> 0), top_p {self.top_p} "
                             f"(in (0, 1]), top_k {self.top_k} (>= 0)")


def _stepper(model: Bert2Bert, params, encoded_BSD, input_mask_BS, max_length: int):
    """step(cache, tokens_B, position) -> (float32 logits [B, V], cache); cache None creates
    it (the first step)."""
    def step(cache, tokens_B, position):
        variables = {"params": params} if cache is None else {"params": params, "cache": cache}
        logits_B1V, mutated = model.apply(
            variables, tokens_B[:, None], None, encoded_BSD, input_mask_BS,
            decode_at=position, cache_length=max_length, method=Bert2Bert.decode,
            mutable=["cache"])
        return logits_B1V[:, 0], mutated["cache"]
    return step


def _one_stack_stepper(model: UniLM, params, input_ids, input_mask, segment_ids, mask_id):
    """The UniLM step: rows `[CLS] source [SEP]` (padded to room for the target) are the
    cache; the generated token at `position` (the start token is 0 and not written) goes
    after the source, and a [MASK] after it is the slot predicted next."""
    if mask_id < 0:
        raise ValueError("decoding the one stack needs Settings.mask_id")
    rows_X = jnp.arange(input_ids.shape[0])

    def put(cache, at_X, token_X):
        return {**cache, "ids": cache["ids"].at[rows_X, at_X].set(token_X),
                "mask": cache["mask"].at[rows_X, at_X].set(1),
                "segments": cache["segments"].at[rows_X, at_X].set(1)}

    def step(cache, tokens_X, position):
        if cache is None:
            cache = {"ids": input_ids, "mask": input_mask, "segments": segment_ids,
                     "source_length": jnp.sum(input_mask, axis=1)}
        else:
            cache = put(cache, cache["source_length"] + position - 1, tokens_X)
        slot_X = cache["source_length"] + position
        cache = put(cache, slot_X, jnp.full_like(tokens_X, mask_id))
        logits_X1V = model.apply({"params": params}, cache["ids"], cache["mask"],
                                 cache["segments"], slot_X[:, None])
        return logits_X1V[:, 0], cache
    return step


@functools.partial(jax.jit, static_argnums=(0, 5))
def generate(model: Bert2Bert | UniLM, params, input_ids, input_mask, segment_ids,
             settings: Settings, rng=None):
    """[B, max_length] int32 token ids, the start token first; `rng` for sampling. The one
    stack's rows need room for max_length - 1 generated tokens after the source."""
    if input_ids.shape[0] * settings.num_beams == 1:
        # One row is decoded as two: for a single row XLA's CPU compiler transposes the
        # [V, D] word embeddings inside the loop, at every token (3x the time per token of
        # two rows, measured with MiniLM; benchmarks/generation_vs_transformers.py).
        twice = [jnp.concatenate([x, x]) for x in (input_ids, input_mask, segment_ids)]
        return _generate(model, params, *twice, settings, rng)[:1]
    return _generate(model, params, input_ids, input_mask, segment_ids, settings, rng)


def _generate(model, params, input_ids, input_mask, segment_ids, settings: Settings, rng):
    if isinstance(model, UniLM):
        beams = settings.num_beams
        step = _one_stack_stepper(model, params, *(jnp.repeat(x, beams, axis=0) for x in
                                                   (input_ids, input_mask, segment_ids)),
                                  settings.mask_id)
        if beams == 1:
            return _greedy(step, input_ids.shape[0], settings, rng)
        return _beam_search(step, input_ids.shape[0], settings)
    encoded_BSD = model.apply({"params": params}, input_ids, input_mask, segment_ids,
                              method=Bert2Bert.encode)
    if settings.num_beams == 1:
        step = _stepper(model, params, encoded_BSD, input_mask, settings.max_length)
        return _greedy(step, input_ids.shape[0], settings, rng)
    beams = settings.num_beams
    step = _stepper(model, params, jnp.repeat(encoded_BSD, beams, axis=0),
                    jnp.repeat(input_mask, beams, axis=0), settings.max_length)
    return _beam_search(step, input_ids.shape[0], settings)


def _pick(logits_BV, settings: Settings, rng):
    if not settings.sample:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits_BV = logits_BV / settings.temperature
    if settings.top_k:
        kth_B1 = jax.lax.top_k(logits_BV, settings.top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
    if settings.top_p < 1.0:
        sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
        before_BV = jnp.cumsum(jax.nn.softmax(sorted_BV, axis=-1), axis=-1) - jax.nn.softmax(
            sorted_BV, axis=-1)
        # The smallest set whose probability reaches top_p: tokens whose predecessors in
        # the sorted order hold less than top_p.
        cutoff_B1 = jnp.min(jnp.where(before_BV < settings.top_p, sorted_BV, jnp.inf), axis=-1,
                            keepdims=True)
        logits_BV = jnp.where(logits_BV < cutoff_B1, -jnp.inf, logits_BV)
    return jax.random.categorical(rng, logits_BV, axis=-1).astype(jnp.int32)


def _greedy(step, batch: int, s: Settings, rng):
    tokens_BT = jnp.full((batch, s.max_length), s.pad_id, jnp.int32).at[:, 0].set(s.start_id)
    logits_BV, cache = step(None, tokens_BT[:, 0], 0)
    rng = jax.random.PRNGKey(0) if rng is None else rng

    def cond(state):
        _, length, unfinished_B, _, _ = state
        return (length < s.max_length) & jnp.any(unfinished_B)

    def body(state):
        tokens_BT, length, unfinished_B, logits_BV, cache = state
        next_B = _pick(logits_BV, s, jax.random.fold_in(rng, length))
        next_B = jnp.where(unfinished_B, next_B, s.pad_id)
        tokens_BT = tokens_BT.at[:, length].set(next_B)
        unfinished_B = unfinished_B & (next_B != s.eos_id)
        logits_BV, cache = step(cache, next_B, length)
        return tokens_BT, length + 1, unfinished_B, logits_BV, cache

    state = (tokens_BT, jnp.int32(1), jnp.ones((batch,), bool), logits_BV, cache)
    return jax.lax.while_loop(cond, body, state)[0]


def _gather(x_BN, index_BK):
    """x[b, index[b, k]] along the beam axis, for x of any rank >= 2."""
    index = index_BK.reshape(index_BK.shape + (1,) * (x_BN.ndim - 2))
    return jnp.take_along_axis(x_BN, index, axis=1)


def _beam_search(step, batch: int, s: Settings):
    """transformers' beam search (generation/utils.py `_beam_search`, 4.57) with static
    shapes: keep the 2N best continuations of all beams, the best N that did not end run on,
    those of the top N that ended join the finished hypotheses (scored with the length
    penalty) if they beat them."""
    beams, candidates = s.num_beams, 2 * s.num_beams
    length_penalty, prompt = s.length_penalty, 1
    running_BNT = jnp.full((batch, beams, s.max_length), s.pad_id, jnp.int32)
    running_BNT = running_BNT.at[:, :, 0].set(s.start_id)
    logits_XV, cache = step(None, running_BNT[:, :, 0].reshape(-1), 0)
    running_scores_BN = jnp.zeros((batch, beams)).at[:, 1:].set(NEG)
    top_beams_K = jnp.arange(candidates) < beams
    state = dict(running=running_BNT, running_scores=running_scores_BN,
                 finished=running_BNT, finished_scores=jnp.full((batch, beams), NEG),
                 is_finished=jnp.zeros((batch, beams), bool),
                 improvable=jnp.ones((batch, 1), bool), all_hit=jnp.array(False),
                 length=jnp.int32(1), logits=logits_XV, cache=cache)

    def cond(st):
        exists_open = ~(jnp.all(st["is_finished"]) & (s.early_stopping is True))
        return jnp.any(st["improvable"]) & exists_open & ~st["all_hit"]

    def body(st):
        length = st["length"]
        vocab = st["logits"].shape[-1]
        log_probs_BNV = jax.nn.log_softmax(st["logits"], axis=-1).reshape(batch, beams, vocab)
        log_probs_BNV = log_probs_BNV + st["running_scores"][:, :, None]
        top_scores_BK, top_index_BK = jax.lax.top_k(log_probs_BNV.reshape(batch, -1),
                                                    candidates)
        from_beam_BK, token_BK = top_index_BK // vocab, top_index_BK % vocab
        top_seqs_BKT = _gather(st["running"], from_beam_BK)
        top_seqs_BKT = jax.vmap(jax.vmap(lambda seq, t: seq.at[length].set(t)))(
            top_seqs_BKT, token_BK)
        hit_BK = (token_BK == s.eos_id) | (length + 1 >= s.max_length)

        # The best continuations that did not end keep running.
        live_scores_BK = top_scores_BK + hit_BK * NEG
        next_BN = jax.lax.top_k(live_scores_BK, beams)[1]
        running = _gather(top_seqs_BKT, next_BN)
        running_scores = _gather(live_scores_BK, next_BN)
        parent_BN = _gather(from_beam_BK, next_BN)

        # Those of the top N that ended compete with the finished hypotheses.
        ended_BK = hit_BK & top_beams_K[None]
        penalised_BK = top_scores_BK / ((length + 1 - prompt) ** length_penalty)
        full_B1 = jnp.all(st["is_finished"], axis=-1, keepdims=True) & (s.early_stopping is True)
        penalised_BK = penalised_BK + full_B1 * NEG + (~st["improvable"]) * NEG
        penalised_BK = penalised_BK + (~ended_BK) * NEG
        merged_scores = jnp.concatenate([st["finished_scores"], penalised_BK], axis=1)
        keep_BN = jax.lax.top_k(merged_scores, beams)[1]
        finished = _gather(jnp.concatenate([st["finished"], top_seqs_BKT], axis=1), keep_BN)
        finished_scores = _gather(merged_scores, keep_BN)
        is_finished = _gather(jnp.concatenate([st["is_finished"], ended_BK], axis=1), keep_BN)

        rows_X = (jnp.arange(batch)[:, None] * beams + parent_BN).reshape(-1)
        cache = jax.tree.map(lambda x: x[rows_X], st["cache"])
        logits, cache = step(cache, running[:, :, length].reshape(-1), length)

        length = length + 1
        if s.early_stopping == "never" and length_penalty > 0.0:
            best_length = s.max_length - prompt
        else:
            best_length = length - prompt
        best_possible_B1 = running_scores[:, :1] / (best_length ** length_penalty)
        worst_BN = jnp.where(is_finished,
                             jnp.min(finished_scores, axis=1, keepdims=True), NEG)
        improvable = st["improvable"] & jnp.any(best_possible_B1 > worst_BN, axis=-1,
                                                 keepdims=True)
        return dict(running=running, running_scores=running_scores, finished=finished,
                    finished_scores=finished_scores, is_finished=is_finished,
                    improvable=improvable, all_hit=jnp.all(hit_BK), length=length,
                    logits=logits, cache=cache)

    return jax.lax.while_loop(cond, body, state)["finished"][:, 0]
