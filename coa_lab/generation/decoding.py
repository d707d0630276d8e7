"""A batched decoder that keeps each row's KV cache across tool turns.

`transformers.generate` serves one turn: a CoA rollout that calls a tool three times would
re-read (prefill) its whole prefix four times, and every row of a batch keeps costing
compute until the slowest row is done. This loop owns the cache instead:

    prefill all prompts once (left-padded)
    each step, every live row feeds exactly ONE token:
        - a queued *forced* token (an observation the environment wrote), or
        - a token sampled from the row's last logits
    when a row ends a turn (stop string, EOS, length), `on_turn_end` decides:
        None  -> the row is finished and leaves the batch (its cache rows are dropped)
        ids   -> these tokens are queued as forced input and the row decodes on after them
    prompts beyond `batch_size` wait; once rows have left, waiting prompts are prefilled on their
    own and join the batch (continuous batching, as vLLM schedules), so a pass does not end
    chunk after chunk with a few long rows decoding alone

Forced tokens go through the same one-token forward as sampled ones, so an observation
costs one batched step per token rather than a re-prefill of everything before it; the
batch stays wide (every slot refilled while prompts wait), which is where a CPU gets its
matmul efficiency (a 576x1536 matmul runs ~3x faster per token at 64 rows than at 8).

Works with any Hugging Face causal LM (and PEFT-wrapped ones): it only needs
`model(input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep)`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

import torch

from coa_lab.generation.decode_numerics import numeric_mode
from coa_lab.generation.kv_cache import GrowingCache
from coa_lab.generation.lora_merge import lora_merged as _lora_merged
from coa_lab.generation.result import Generation
from coa_lab.generation.sampling import sample_rows

# transformers and kv_cache (built on it) are imported inside the functions that use them: the pipeline
# imports this module (llm -> hf_generator) for stages that never decode, and transformers costs ~1 s


@dataclass
class _Row:
    index: int  # position in the caller's prompt list
    prompt_len: int
    temperature: float = 0.0  # this row's own: greedy and sampled rows can share a pass
    forced: deque = field(default_factory=deque)
    turn: list[int] = field(default_factory=list)  # tokens sampled in the current turn
    turn_logprobs: list[float] = field(default_factory=list)  # their sampling log-probs (when sampled)
    turn_entropies: list[float] = field(default_factory=list)  # the entropy each was drawn from
    response_len: int = 0  # sampled + forced tokens since the prompt


# on_turn_end receives [(prompt index, this turn's Generation)] for every row that ended a
# turn in the same step (so tools can run concurrently) and returns, per event, the tokens
# to force next or None to finish that row.
TurnEnd = Callable[[list[tuple[int, Generation]]], list["list[int] | None"]]


def _stop_hit(tokenizer, turn: list[int], stops: Sequence[str], longest: int) -> bool:
    # Only the tail can complete a stop string; decoding it alone is cheap. A stop split
    # across many tokens is still caught: the tail covers `longest` characters' worth.
    if not stops:
        return False
    tail = tokenizer.decode(turn[-(longest + 2):], skip_special_tokens=False)
    return any(s in tail for s in stops)


def decode(model, tokenizer, prompts: list[list[int]], on_turn_end: TurnEnd, *, max_new_tokens: int,
           max_response_tokens: int | None = None, temperature: float | Sequence[float] = 0.0, top_p: float = 1.0,
           stop: Sequence[str] = (), batch_size: int = 64, compute=None, prefix_cache=None,
           stats: dict | None = None) -> None:
    """Decode every prompt, turn after turn, until `on_turn_end` finishes it.

    max_new_tokens: per turn; max_response_tokens: per row over all turns, forced tokens
    included (a turn ends with finish "length" when either runs out).
    temperature: one for every row, or one per prompt (0: greedy; rows keep log-probs only where sampled).
    prefix_cache: a coa_lab.generation.prefix_cache.PrefixCache kept across calls (frozen weights only);
    stats: counters of prompt tokens sent and prompt tokens actually prefilled, incremented.
    """
    budget = max_response_tokens if max_response_tokens is not None else 10**9
    if isinstance(temperature, (int, float)):
        temperature = [float(temperature)] * len(prompts)
    elif len(temperature) != len(prompts):
        raise ValueError(f"{len(temperature)} temperatures for {len(prompts)} prompts")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _lora_merged(model), numeric_mode(model, compute, max(1, batch_size)):
            # sorted, so prompts that share a prefix (a team agent's instruction and worked
            # examples) land in the same chunk and that prefix is prefilled once
            order = sorted(range(len(prompts)), key=lambda i: prompts[i])
            slots = max(1, batch_size)
            if CONTINUOUS and len(order) > slots and GrowingCache.fits(model):
                # continuous batching: the first `slots` prompts start, the rest wait and take
                # the slots finished rows free (benchmarks/bench_decode_occupancy.py)
                first = order[:slots]
                _decode_chunk(model, tokenizer, [prompts[i] for i in first], first, on_turn_end,
                              max_new_tokens, budget, temperature, top_p, stop, prefix_cache, stats,
                              waiting=deque((i, prompts[i]) for i in order[slots:]), slots=slots)
                return
            # transformers' own cache (a sliding-window model): equal chunks, 72 prompts at
            # batch_size 64 as 36 + 36, not 64 + 8 (every weight is read whatever the width)
            n_chunks = -(-len(order) // max(1, batch_size))
            size = -(-len(order) // max(1, n_chunks))
            for start in range(0, len(order), size):
                chunk = order[start:start + size]
                _decode_chunk(model, tokenizer, [prompts[i] for i in chunk], chunk, on_turn_end,
                              max_new_tokens, budget, temperature, top_p, stop, prefix_cache, stats)
    finally:
        if was_training:
            model.train()


MIN_SHARED_PREFIX = 48  # tokens; shorter common prefixes are not worth a separate forward


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (also used by coa_lab/training/packing.py)."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def shared_prefix_groups(prompts: list[list[int]], min_shared: int = MIN_SHARED_PREFIX) -> list[tuple[int, int]]:
    """Split consecutive (sorted) prompts into groups sharing a prefix of >= min_shared tokens.
    Returns (group size, shared length) per group; the shared part always leaves each member
    at least one token of its own (its last logits come from the suffix forward); a group of
    one shares everything but its last token with itself.

    Where to cut is chosen by cost, because both passes are padded: the prefix pass costs
    (groups x longest shared part), the suffix pass (rows x longest own part). Grouping every
    prompt that shares a short instruction leaves long suffixes for all; cutting only where
    the shared part drops below a threshold T keeps worked examples shared. Every T in the
    observed common-prefix lengths is tried, and "no sharing" (all groups of one) wins when
    nothing beats plain prefill.
    """
    n = len(prompts)
    lcp = [common_prefix(prompts[i], prompts[i + 1]) for i in range(n - 1)]

    def split(threshold: int) -> list[tuple[int, int]]:
        groups, i = [], 0
        while i < n:
            shared, j = len(prompts[i]) - 1, i + 1
            while j < n and lcp[j - 1] >= threshold:
                shared, j = min(shared, lcp[j - 1], len(prompts[j]) - 1), j + 1
            groups.append((j - i, shared))
            i = j
        return groups

    def cost(groups: list[tuple[int, int]]) -> int:
        if all(size == 1 for size, _ in groups):
            return n * max(len(p) for p in prompts)  # _prefill's plain path: one padded pass
        own, k = [], 0
        for size, shared in groups:
            own += [len(p) - shared for p in prompts[k:k + size]]
            k += size
        return len(groups) * max(shared for _, shared in groups) + n * max(own)

    candidates = [split(t) for t in sorted({min_shared, *(x for x in lcp if x >= min_shared)})]
    candidates.append([(1, len(p) - 1) for p in prompts])
    return min(candidates, key=cost)


def _left_pad(seqs, pad: int, device):
    """Token ids and attention mask [rows, longest], each row right-aligned after `pad` tokens."""
    width = max(len(x) for x in seqs)
    ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in seqs], device=device, dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs], device=device, dtype=torch.long)
    return ids, mask


def _count(stats: dict | None, key: str, n: int) -> None:
    if stats is not None:
        stats[key] = stats.get(key, 0) + n


def _prefill(model, prompts, pad, device, prefix_cache=None, stats=None):
    """Prefill a chunk; rows sharing a prefix compute it once, and a prefix an earlier call
    computed (coa_lab/generation/prefix_cache.py, when given) is not computed at all. Returns (cache,
    mask, logits of each row's last token, each row's next position).
    stats: {"prompt_tokens_sent", "prompt_tokens_prefilled"} counters, incremented."""
    from transformers import DynamicCache  # late: see the imports above

    _count(stats, "prompt_tokens_sent", sum(len(p) for p in prompts))
    cache = GrowingCache() if GrowingCache.fits(model) else DynamicCache()
    if prefix_cache is not None and isinstance(cache, GrowingCache):
        prefix_cache.check(model)  # weights moved since the entries were computed: they go
    else:
        prefix_cache = None
    groups = shared_prefix_groups(prompts, MIN_SHARED_PREFIX)
    plain = all(size == 1 for size, _ in groups) or any(shared == 0 for _, shared in groups)
    if plain and prefix_cache is not None and any(prefix_cache.lookup(p[:-1])[0] for p in prompts):
        groups, plain = [(1, len(p) - 1) for p in prompts], False  # each row its own group: its prefix is cached
    if plain:
        ids, mask = _left_pad(prompts, pad, device)
        _count(stats, "prompt_tokens_prefilled", sum(len(p) for p in prompts))
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, mask, out.logits[:, -1], mask.sum(-1)
    # 1) every group's shared prefix once (a row of its own); 2) the cache rows copied to the
    # group's members; 3) each member's own suffix on top, at positions after its prefix
    pre_mask = _prefill_shared_prefixes(model, prompts, groups, cache, pad, device, prefix_cache, stats)
    member_of = torch.tensor([g for g, (size, _) in enumerate(groups) for _ in range(size)], device=device)
    shared_len = torch.tensor([shared for size, shared in groups for _ in range(size)], device=device)
    cache.batch_select_indices(member_of)
    pre_mask = pre_mask[member_of]
    suffixes = [p[int(n):] for p, n in zip(prompts, shared_len.tolist())]
    suf_ids, suf_mask = _left_pad(suffixes, pad, device)
    _count(stats, "prompt_tokens_prefilled", sum(len(x) for x in suffixes))
    position = shared_len[:, None] + (suf_mask.cumsum(-1) - 1).clamp(min=0)
    mask = torch.cat([pre_mask, suf_mask], dim=-1)
    out = model(input_ids=suf_ids, attention_mask=mask, position_ids=position,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache, mask, out.logits[:, -1], mask.sum(-1)


def _prefill_shared_prefixes(model, prompts, groups, cache, pad, device, prefix_cache, stats):
    """Every group's shared prefix into `cache` once, a row per group: the part an earlier call
    left in prefix_cache is copied in, the rest computed on top. Returns those rows' mask."""
    starts = [sum(size for size, _ in groups[:g]) for g in range(len(groups))]
    prefixes = [prompts[start][:shared] for start, (_, shared) in zip(starts, groups)]
    hits = [prefix_cache.lookup(x) if prefix_cache is not None else (0, None) for x in prefixes]
    hits = [(min(m, len(x)), layers) for (m, layers), x in zip(hits, prefixes)]
    reused = max(m for m, _ in hits)
    pre_mask = torch.zeros((len(groups), 0), dtype=torch.long, device=device)
    if reused:  # cached keys and values, right-aligned after left padding like a prefill's
        pre_mask = torch.tensor([[0] * (reused - m) + [1] * m for m, _ in hits], device=device, dtype=torch.long)
        n_layers = len(next(layers for m, layers in hits if m))
        for layer in range(n_layers):
            k0, v0 = next(layers for m, layers in hits if m)[layer]
            keys = k0.new_zeros((len(groups), k0.shape[1], reused, k0.shape[3]))
            values = v0.new_zeros((len(groups), v0.shape[1], reused, v0.shape[3]))
            for g, (m, layers) in enumerate(hits):
                if m:
                    keys[g, :, reused - m:] = layers[layer][0][0, :, :m]
                    values[g, :, reused - m:] = layers[layer][1][0, :, :m]
            cache.update(keys, values, layer)
    rest = [x[m:] for x, (m, _) in zip(prefixes, hits)]
    if any(rest):
        rest_ids, rest_mask = _left_pad(rest, pad, device)
        _count(stats, "prompt_tokens_prefilled", sum(len(x) for x in rest))
        done = torch.tensor([m for m, _ in hits], device=device)
        pre_mask = torch.cat([pre_mask, rest_mask], dim=-1)
        model(input_ids=rest_ids, attention_mask=pre_mask, position_ids=done[:, None] + (rest_mask.cumsum(-1) - 1).clamp(min=0),
              past_key_values=cache, use_cache=True, logits_to_keep=1)
    if prefix_cache is not None:  # keep each newly computed shared prefix for the next call
        for g, (x, (m, _)) in enumerate(zip(prefixes, hits)):
            # a prefix shared by several rows and mostly new: a lone row's prompt or a few
            # tokens past a cached entry would only churn the cache
            if groups[g][0] > 1 and len(x) - m >= prefix_cache.min_reuse:
                cols = pre_mask[g].nonzero().flatten()
                prefix_cache.store(x, [(lay.keys[g:g + 1, :, cols].clone(), lay.values[g:g + 1, :, cols].clone())
                                       for lay in cache.layers])
    return pre_mask


CONTINUOUS = True  # refill freed slots with waiting prompts (False: the equal chunks of before; a benchmark arm)
ADMIT_FRACTION = 8  # waiting prompts join once a 1/8 of the slots is free: one prefill for several
# the cache drops its dead left part once it is TRIM_MIN columns and 1/TRIM_FRACTION of the cache:
# each trim copies the whole cache once, so it waits for enough to gain
TRIM_MIN, TRIM_FRACTION = 64, 4


def _leading_pad(mask) -> int:
    """Columns at the left that no row attends to (every row's mask is 0 there)."""
    return int((mask.cumsum(-1) == 0).sum(-1).min())


def _decode_chunk(model, tokenizer, prompts, indices, on_turn_end, max_new_tokens, budget,
                  temperature, top_p, stops, prefix_cache=None, stats=None, waiting=None, slots=None):
    """Decode `prompts` (rows `indices` of the caller's list; `temperature` by that index) to the
    end; with `waiting` (a deque
    of (index, prompt)) and `slots`, waiting prompts are prefilled on their own and join the
    batch as rows leave it (own cache only: GrowingCache.admit)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    longest = max((len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stops), default=0)
    ends_turn = partial(_turn_finish, tokenizer, tokenizer.eos_token_id, stops, longest, max_new_tokens, budget)
    waiting = waiting if waiting is not None else deque()
    slots = slots or len(prompts)

    cache, mask, logits, next_pos = _prefill(model, prompts, pad, device, prefix_cache, stats)
    rows = [_Row(i, len(p), temperature[i]) for i, p in zip(indices, prompts)]

    while rows:
        feed, ended = _next_tokens(rows, logits, top_p, tokenizer, ends_turn)
        done = _answer_turn_ends(rows, ended, on_turn_end, budget)
        keep = [s for s in range(len(rows)) if s not in done]
        if not keep and not waiting:
            return
        if not keep:  # every row ended: the waiting prompts start afresh
            rows = []
        elif len(keep) < len(rows):
            # the own cache moves the last live rows into the freed slots (a row's copy each);
            # transformers' cache gathers every remaining row
            if isinstance(cache, GrowingCache):
                order = cache.compact(keep)
            else:
                order = keep
                cache.batch_select_indices(torch.tensor(keep, device=device))
            index = torch.tensor(order, device=device)
            mask, next_pos = mask[index], next_pos[index]
            rows = [rows[s] for s in order]
            feed = [feed[s] for s in order]
            if isinstance(cache, GrowingCache):
                dead = _leading_pad(mask)  # columns only rows that left attended to
                if dead >= max(TRIM_MIN, mask.shape[1] // TRIM_FRACTION):
                    cache.drop_front(dead)
                    mask = mask[:, dead:]
        if rows:
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
            out = model(input_ids=torch.tensor(feed, device=device)[:, None], attention_mask=mask,
                        position_ids=next_pos[:, None], past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
        free = slots - len(rows)
        if waiting and (not rows or free >= max(1, slots // ADMIT_FRACTION)):
            joining = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            new_cache, new_mask, new_logits, new_pos = _prefill(model, [p for _, p in joining], pad, device,
                                                                prefix_cache, stats)
            if rows:  # right-aligned on the shared column axis (kv_cache.GrowingLayer.admit)
                width = max(mask.shape[1], new_mask.shape[1])
                cache.admit(new_cache)
                mask = torch.cat([torch.nn.functional.pad(mask, (width - mask.shape[1], 0)),
                                  torch.nn.functional.pad(new_mask, (width - new_mask.shape[1], 0))])
                logits = torch.cat([logits, new_logits])
                next_pos = torch.cat([next_pos, new_pos])
            else:
                cache, mask, logits, next_pos = new_cache, new_mask, new_logits, new_pos
            rows += [_Row(i, len(p), temperature[i]) for i, p in joining]


def _turn_finish(tokenizer, eos, stops, longest, max_new_tokens, budget, row: _Row, token: int) -> str | None:
    """Why the sampled `token` ends its row's turn ("eos", "stop", "length"), or None."""
    if token == eos:
        return "eos"
    if _stop_hit(tokenizer, row.turn, stops, longest):
        return "stop"
    if len(row.turn) >= max_new_tokens or row.response_len >= budget:
        return "length"
    return None


def _next_tokens(rows: list[_Row], logits, top_p: float, tokenizer, ends_turn):
    """Every live row's next token: its next forced one, else one sampled from its last logits at
    the row's temperature. Returns (the tokens to feed, [(slot, Generation)] of each turn a
    sampled token ended)."""
    sampled, chosen_lp, entropy = sample_rows(logits, [r.temperature for r in rows], top_p)
    sampled = sampled.tolist()
    chosen_lp = chosen_lp.tolist() if chosen_lp is not None else None
    entropy = entropy.tolist() if entropy is not None else None
    feed: list[int] = []
    ended: list[tuple[int, Generation]] = []
    for slot, row in enumerate(rows):
        if row.forced:
            feed.append(row.forced.popleft())
            row.response_len += 1
            continue
        token = sampled[slot]
        row.turn.append(token)
        keeps = chosen_lp is not None and row.temperature > 0  # a greedy row sampled nothing
        if keeps:
            row.turn_logprobs.append(chosen_lp[slot])
            row.turn_entropies.append(entropy[slot])
        row.response_len += 1
        feed.append(token)
        finish = ends_turn(row, token)
        if finish:
            gen = Generation(row.turn, tokenizer.decode(row.turn, skip_special_tokens=False), finish,
                             row.prompt_len + row.response_len - len(row.turn),
                             logprobs=row.turn_logprobs if keeps else None,
                             entropies=row.turn_entropies if keeps else None)
            ended.append((slot, gen))
    return feed, ended


def _answer_turn_ends(rows: list[_Row], ended, on_turn_end: TurnEnd, budget: int) -> set[int]:
    """Ask `on_turn_end` what follows the turns that ended, queue the tokens it forces (within the
    row's budget) and start each row's next turn. Returns the slots of the rows that are done."""
    if not ended:
        return set()
    replies = on_turn_end([(rows[slot].index, gen) for slot, gen in ended])
    if len(replies) != len(ended):
        raise ValueError(f"on_turn_end returned {len(replies)} replies for {len(ended)} ended turns")
    done = set()
    for (slot, _), reply in zip(ended, replies):
        row = rows[slot]
        row.turn, row.turn_logprobs, row.turn_entropies = [], [], []  # new lists: the Generation keeps the old
        room = budget - row.response_len
        if reply is None or room <= 0:
            done.add(slot)
        else:
            row.forced.extend(reply[:room])
            if not row.forced:  # an empty observation would leave the row waiting on nothing
                done.add(slot)
    return done
