"""Keys and values of prompt prefixes kept from one decode call to the next.

The teacher's agents each start every prompt with the same instruction and worked examples
(capture/worked_examples.py): several hundred tokens. Within one batched call the decoder
already prefills such a shared prefix once (decoding.shared_prefix_groups); across calls, a
capture of 72 tasks in two batches, or the teacher scored on 192 test tasks in six, would
prefill it again in every batch. This cache keeps each computed shared prefix's K/V, and a
later prefill starts from the longest cached prefix of its own shared part: only the rest is
computed. K/V at position t depend on tokens <= t only, so a cached prefix can also serve a
shorter prompt that agrees with it on its first m tokens.

Valid only while the weights stay as they were: every lookup first compares the model's
parameter version counters (torch bumps them on every in-place change, an optimizer step or a
LoRA merge included) and drops everything when they moved. So the teacher, whose weights never
change, gets the reuse; a model being trained, or a LoRA merged for each call, simply misses.
Opt-in (`HFGenerator(keep_prefixes=True)`, used by the teacher): it holds memory.
"""

from __future__ import annotations

from collections import OrderedDict

from coa_lab.generation.decoding import MIN_SHARED_PREFIX, common_prefix

# one entry per distinct prefix, LRU; 4096 tokens of SmolLM2-135M (30 layers, 3 KV heads x 64,
# fp32) are ~190 MB, of a 3B model in bf16 ~150 MB
MAX_TOKENS = 4096
MIN_REUSE = MIN_SHARED_PREFIX  # tokens; shorter matches are not worth splitting a prefill


class PrefixCache:
    """Token prefix -> per-layer (keys, values) [1, kv heads, len, head dim], least recently used out."""

    def __init__(self, max_tokens: int = MAX_TOKENS, min_reuse: int = MIN_REUSE):
        self.max_tokens, self.min_reuse = max_tokens, min_reuse
        self.entries: OrderedDict[tuple[int, ...], list] = OrderedDict()
        self._weights = None  # the parameter versions the entries were computed with

    def check(self, model) -> None:
        """Forget every entry if the model's weights changed since they were stored."""
        stamp = (id(model), tuple(p._version for p in model.parameters()))
        if stamp != self._weights:
            self.entries.clear()
            self._weights = stamp

    def tokens(self) -> int:
        return sum(len(k) for k in self.entries)

    def lookup(self, prefix) -> tuple[int, list | None]:
        """(m, layers): the longest cached match of `prefix`'s first m tokens (m >= min_reuse),
        its K/V per layer (sliced to m by the caller); (0, None) when nothing matches enough."""
        best, best_key = 0, None
        for key in self.entries:
            m = common_prefix(key, prefix)
            if m > best:
                best, best_key = m, key
        if best < self.min_reuse:
            return 0, None
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key]

    def store(self, prefix, layers: list) -> None:
        """Keep `layers` ([(k, v)] per layer, [1, H, len(prefix), D]) for `prefix`. An entry that
        is a prefix of the new one is replaced by it; a new one already covered is not stored."""
        key = tuple(int(t) for t in prefix)
        if len(key) < self.min_reuse or len(key) > self.max_tokens:
            return
        for old in list(self.entries):
            if len(old) >= len(key) and old[: len(key)] == key:
                self.entries.move_to_end(old)
                return
            if len(old) < len(key) and key[: len(old)] == old:
                del self.entries[old]
        self.entries[key] = layers
        while self.tokens() > self.max_tokens:
            self.entries.popitem(last=False)
