"""Continuous generation on an HF model (rollout.mode: continuous, rollout.backend: hf): a decode
loop of our own over a fixed number of slots, one row each of a KV cache shared by all of them.

Layout. Every slot's tokens in the cache are contiguous and end at its last column (left
padding, as generate() lays out a batch): the attention mask of a row is zeros, then ones.
A decode step appends one column to every row; a newly admitted answer's prompt is prefilled
on its own and spliced into its row's last columns; columns that no answer in flight reaches
any more are cut off. So an answer never sees another's tokens and the cache never holds
more than the longest answer in flight.

Sampling. Token t of an answer is drawn by inverse CDF from one uniform number seeded by (the
answer's seed, t), never from a shared RNG stream: which other answers share the step does
not change it, and a resume needs no RNG state. Its log-prob is that of the distribution it
was drawn from (temperature, then top-k and top-p, renormalised), as vLLM's processed
log-probs; grpo.scoring.kernels.kept_log_mass's rule picks the kept tokens.

Determinism. The rows' numbers depend on how the cache is laid out (the padding) and on which
rows share a forward. `rebuild_cache` recomputes the cache of every answer in flight from its
tokens in one canonical layout; the sampler calls it at every batch cut, and a resumed sampler
calls it through `restore`, so both decode on from the same cache, bit for bit.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from grpo.rollout.base import EngineContext
from grpo.rollout.hf import HFRollout, eos_ids
from grpo.rollout.slots import Answer, SlotRequest, SlotTable
from grpo.scoring.kernels import Truncation, kept_tokens
from grpo.weights.version import Version

NO_TRUNCATION = Truncation()


def build(ctx: EngineContext) -> HFSlotEngine | HFRollout:
    """rollout.backend: hf. Samples with the sampler's own policy, so a reload of the sampler's
    weights is a reload of the engine's: lock-step with generate() (HFRollout, a batch's
    answers in one call), continuous with this module's slots."""
    r = ctx.cfg.rollout
    if r.mode != "continuous":
        return HFRollout(ctx.policy.module(), ctx.tokenizer, ctx.stop_event, cache=r.hf_cache)
    return HFSlotEngine(
        ctx.policy.module(),
        ctx.tokenizer,
        slots=r.slots or r.questions_per_step * r.group_size,
        temperature=r.temperature,
        truncation=Truncation(r.top_p, r.top_k),
        stop=ctx.stop_strings,
        kv_on_update=r.kv_on_update,
        stop_event=ctx.stop_event,
    )


def uniforms(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """One uniform number in (0, 1) per (seed, position): a pure function of the two."""
    u = [np.random.default_rng((s, t)).random() for s, t in zip(seeds, positions, strict=True)]
    return np.maximum(np.asarray(u, np.float64), 1e-12)


def sample_rows(
    logits: torch.Tensor, temperature: float, truncation: Truncation, u: np.ndarray
) -> tuple[list[int], list[float]]:
    """A token per row of logits (n, V) by inverse CDF at u (n,), from softmax(logits / T)
    truncated by top-k then top-p and renormalised; and its log-prob under that distribution."""
    logp = (logits.float() / temperature).log_softmax(dim=-1)  # (n, V)
    order = None
    if truncation.active:  # the kept tokens as kept_log_mass keeps them (ascending order)
        logp, order = logp.sort(dim=-1)
        logp = logp.masked_fill(~kept_tokens(logp, truncation), -torch.inf)
        logp = logp - logp.logsumexp(dim=-1, keepdim=True)
    cdf = logp.exp().cumsum(dim=-1)  # (n, V)
    target = torch.as_tensor(u, dtype=cdf.dtype, device=cdf.device).unsqueeze(-1) * cdf[:, -1:]
    pos = torch.searchsorted(cdf, target).clamp(max=cdf.shape[-1] - 1)  # (n, 1)
    chosen = logp.gather(-1, pos).squeeze(-1)
    tokens = pos if order is None else order.gather(-1, pos)
    return tokens.squeeze(-1).tolist(), chosen.tolist()


class HFSlotEngine(SlotTable):
    """The SlotEngine protocol (grpo.rollout.slots) on an HF causal LM."""

    def __init__(
        self,
        model,
        tokenizer,
        slots: int,
        temperature: float = 1.0,
        truncation: Truncation = NO_TRUNCATION,
        stop: tuple[str, ...] = (),
        kv_on_update: str = "keep",
        stop_event: threading.Event | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        super().__init__(slots)
        self.temperature = temperature
        self.truncation = truncation
        self.stop = stop
        self.kv_on_update = kv_on_update
        self.stop_event = stop_event or threading.Event()
        self.version = 0
        self.eos = set(eos_ids(model, tokenizer))
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        self.pending: list[int] = []  # admitted slots whose prompts the next step prefills
        # The cache of every slot's tokens but its last sampled one (fed by the next step).
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(slots, 0, dtype=torch.long, device=self.device)
        self.lengths = [0] * slots  # tokens of each slot in the cache (its last columns)

    # ------------------------------------------------------------------ the protocol

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        answers = self.seat(requests)
        self.pending += [a.slot for a in answers]
        return answers

    @torch.no_grad()
    def step(self) -> list[Answer]:
        """One token per answer in flight: decoded, or a new answer's first from its prefill."""
        if self.stop_event.is_set() or not self.in_flight():
            return []
        new = self.pending
        decoding = [s for s, a in enumerate(self.answers) if a is not None and s not in new]
        sampled: dict[int, torch.Tensor] = {}
        if decoding:
            logits = self._decode()
            sampled |= {s: logits[s] for s in decoding}
        if new:
            sampled |= dict(zip(new, self._prefill(new), strict=True))
            self.pending = []
        if self.cache is not None:
            self.mask = trimmed(self.cache, self.mask, max(self.lengths + [1]))
        order = sorted(sampled)
        return self._append(order, torch.stack([sampled[s] for s in order]))

    @torch.no_grad()
    def rebuild_cache(self) -> None:
        """The cache of every answer in flight (prompt and tokens but the last) recomputed in
        one forward, left-padded; a slot with none holds one pad token."""
        self.pending = [s for s in self.pending if self.answers[s] is not None]
        seqs = [self._cached_tokens(s) for s in range(self.slots)]
        ids, mask = left_padded(seqs, self.pad)
        self.cache = DynamicCache()
        self._forward(ids.to(self.device), mask.to(self.device), cache_position=0)
        self.mask = mask.to(self.device)
        self.lengths = [
            0 if self.answers[s] is None or s in self.pending else len(q)
            for s, q in enumerate(seqs)
        ]

    def restore(self, answers: list[Answer]) -> None:
        self.reseat(answers)
        for a in answers:
            if not a.tokens:
                self.pending.append(a.slot)
        self.rebuild_cache()

    def load(self, version: Version) -> None:
        """No weights to load (the model is the sampler's policy, which the sampler loaded)."""
        self.version = version.number
        if self.kv_on_update == "recompute":
            self.rebuild_cache()

    def close(self) -> None:
        self.cache = None

    # ------------------------------------------------------------------ the cache

    def _cached_tokens(self, slot: int) -> list[int]:
        """What slot `slot`'s cache holds once rebuilt: its prompt and every token but the last
        (one pad token for an empty or a pending slot, which the rebuild only keeps finite)."""
        a = self.answers[slot]
        if a is None or slot in self.pending:
            return [self.pad]
        return [int(t) for t in a.request.prompt_ids] + a.tokens[:-1]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache_position: int) -> torch.Tensor:
        """The model on ids (B, T) after the cache's columns, positions counted from each row's
        first real token; the last position's logits (B, V). Appends T columns to the cache."""
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            cache_position=torch.arange(
                cache_position, cache_position + ids.shape[1], device=self.device
            ),
            use_cache=True,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :]

    def _decode(self) -> torch.Tensor:
        """Every slot's last token through the model (empty slots feed a pad token that attends
        to its whole row, finite and unused): logits (slots, V)."""
        assert self.cache is not None
        ids = torch.full((self.slots, 1), self.pad, dtype=torch.long)
        for s, a in enumerate(self.answers):
            if a is not None and s not in self.pending:
                ids[s, 0] = a.tokens[-1]
        width = self.mask.shape[1]
        mask = torch.cat(
            [self.mask, torch.ones(self.slots, 1, dtype=torch.long, device=self.device)], dim=1
        )
        for s, a in enumerate(self.answers):
            if a is None or s in self.pending:
                mask[s] = 1
        logits = self._forward(ids.to(self.device), mask, cache_position=width)
        for s in range(self.slots):
            if self.answers[s] is not None and s not in self.pending:
                self.lengths[s] += 1
            else:
                mask[s] = 0
        self.mask = mask
        return logits

    def _prefill(self, slots: list[int]) -> list[torch.Tensor]:
        """The prompts of these slots through the model on a cache of their own, spliced into
        their rows' last columns; each one's last logits."""
        prompts = [self.answers[s].request.prompt_ids for s in slots]  # type: ignore[union-attr]
        ids, mask = left_padded([[int(t) for t in p] for p in prompts], self.pad)
        width = ids.shape[1]
        shared, self.cache = self.cache, DynamicCache()
        logits = self._forward(ids.to(self.device), mask.to(self.device), cache_position=0)
        fresh, self.cache = self.cache, shared
        self.cache, self.mask = grown(self.cache, self.mask, width, fresh)
        assert self.cache is not None
        L = self.mask.shape[1]
        for i, s in enumerate(slots):
            n = len(prompts[i])
            for mine, theirs in zip(self.cache.layers, fresh.layers, strict=True):
                mine.keys[s, :, L - n :] = theirs.keys[i, :, width - n :]
                mine.values[s, :, L - n :] = theirs.values[i, :, width - n :]
            self.mask[s] = 0
            self.mask[s, L - n :] = 1
            self.lengths[s] = n
        return list(logits)

    # ------------------------------------------------------------------ the answers

    def _append(self, slots: list[int], logits: torch.Tensor) -> list[Answer]:
        """Sample each slot's next token, record it; the answers that finished leave."""
        answers = [self.answers[s] for s in slots]
        u = uniforms([a.request.seed for a in answers], [len(a.tokens) for a in answers])
        tokens, logps = sample_rows(logits, self.temperature, self.truncation, u)
        finished = []
        for a, tok, lp in zip(answers, tokens, logps, strict=True):
            a.tokens.append(int(tok))
            a.logps.append(float(lp))
            a.versions.append(self.version)
            a.finish_reason = finish_reason(a, self.eos, self.stop, self.tokenizer)
            if a.done:
                self.release(a.slot)
                self.lengths[a.slot] = 0
                finished.append(a)
        return finished


def finish_reason(a: Answer, eos: set[int], stop: tuple[str, ...], tokenizer) -> str | None:
    """Why answer `a` ends with its newest token: "stop" (EOS, or its text now holds a stop
    string), "length" (its cap), or None (it goes on)."""
    if a.tokens[-1] in eos:
        return "stop"
    if stop:
        # The tail's text: a stop string ending in the newest token starts within it.
        tail = a.tokens[-(max(len(s) for s in stop) + 4) :]
        text = tokenizer.decode(tail, skip_special_tokens=False)
        if any(s in text for s in stop):
            return "stop"
    if len(a.tokens) >= a.request.max_new_tokens:
        return "length"
    return None


def grown(
    cache: DynamicCache | None, mask: torch.Tensor, width: int, like: DynamicCache
) -> tuple[DynamicCache, torch.Tensor]:
    """At least `width` columns in the cache (a new one shaped as `like`'s layers, with
    mask's rows), the new columns zeros, masked, on the left; the cache and its mask."""
    slots = mask.shape[0]
    if cache is None:
        cache = DynamicCache()
        for i, layer in enumerate(like.layers):
            k, v = layer.keys, layer.values
            cache.update(
                k.new_zeros(slots, k.shape[1], 0, k.shape[-1]),
                v.new_zeros(slots, v.shape[1], 0, v.shape[-1]),
                i,
            )
    extra = width - mask.shape[1]
    if extra <= 0:
        return cache, mask
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        layer.keys = torch.cat([k.new_zeros(*k.shape[:2], extra, k.shape[-1]), k], dim=2)
        layer.values = torch.cat([v.new_zeros(*v.shape[:2], extra, v.shape[-1]), v], dim=2)
    return cache, torch.cat([mask.new_zeros(slots, extra), mask], dim=1)


def trimmed(cache: DynamicCache, mask: torch.Tensor, longest: int) -> torch.Tensor:
    """Cut the cache's columns on the left that no row's last `longest` reach; the mask."""
    cut = mask.shape[1] - longest
    if cut <= 0:
        return mask
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, cut:]
        layer.values = layer.values[:, :, cut:]
    return mask[:, cut:]


def left_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as one left-padded batch: ids and attention mask, (B, longest)."""
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, q in enumerate(seqs):
        ids[row, width - len(q) :] = torch.as_tensor(q, dtype=torch.long)
        mask[row, width - len(q) :] = 1
    return ids, mask
