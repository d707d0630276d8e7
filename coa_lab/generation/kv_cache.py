"""The decoder's own KV cache: preallocated, written in place, rows leaving by a one-row move.

transformers' `DynamicCache` appends each decode step's key/value with `torch.cat`, which copies
every layer's whole cache on every token: profiled on a 2-core CPU, 76% of a batch-36 decode
step of SmolLM2-135M was `aten::cat`. Here each layer holds one buffer
[rows, kv heads, capacity, head dim]:

    write:  buffer[:, :, length] = new key          (one token's worth, in place)
    read:   buffer[:rows, :, :length]               (a view: no copy)
    grow:   capacity doubles when full              (amortised: each entry is copied O(1) times)
    leave:  the last live row moves into the freed slot, the batch view shrinks by one
            (one row's copy, not a re-copy of every remaining row)

    admit:  rows of another cache (waiting prompts, prefilled on their own) join below the live
            rows, right-aligned on the shared column axis; their columns left of the prompt are
            zeros the attention mask hides (a longer prompt first shifts the live rows right)
    trim:   columns no live row uses any more (left of every row's first token) are dropped

`compact(keep)` returns the new slot order so the decoder reorders its own per-row state the
same way. Works with any model whose layers call `past_key_values.update(k, v, layer_idx)`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

MIN_GROWTH = 64  # tokens of room added at least, so a short prompt does not regrow every step


class GrowingLayer(DynamicLayer):
    """One layer's keys and values in a buffer that only reallocates when it fills up."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length, self.rows = 0, key_states.shape[0]
        self._k = self._v = None
        # keys and values may differ in dtype: under autocast the values leave v_proj in bf16
        # while RoPE (fp32 cos/sin) returns fp32 keys. Each buffer keeps its own, as DynamicCache's
        # concatenation does; a values buffer in the keys' fp32 would double its memory and
        # convert every write.
        self._v_dtype = value_states.dtype

    def _reserve(self, need: int, rows: int | None = None, shift: int = 0) -> None:
        """Room for `need` columns and `rows` rows; `shift` moves the live entries that many
        columns right (zeros on their left), which always reallocates."""
        rows = self.rows if rows is None else rows
        capacity = 0 if self._k is None else self._k.shape[2]
        row_capacity = 0 if self._k is None else self._k.shape[0]
        if need <= capacity and rows <= row_capacity and not shift:
            return
        new = capacity if need <= capacity else max(2 * capacity, need + MIN_GROWTH)
        new_rows = max(rows, row_capacity)
        k = torch.empty((new_rows, *self._shape[1:2], new, self._shape[3]), dtype=self.dtype, device=self.device)
        v = torch.empty_like(k, dtype=self._v_dtype)
        if shift:
            k[:, :, :shift] = 0
            v[:, :, :shift] = 0
        if self.length:
            k[: self.rows, :, shift : shift + self.length] = self._k[: self.rows, :, : self.length]
            v[: self.rows, :, shift : shift + self.length] = self._v[: self.rows, :, : self.length]
        self._k, self._v = k, v

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._shape = tuple(key_states.shape)
        if key_states.shape[0] != self.rows:
            raise ValueError(f"cache holds {self.rows} rows, got {key_states.shape[0]}")
        t = key_states.shape[2]
        self._reserve(self.length + t)
        self._k[: self.rows, :, self.length : self.length + t] = key_states
        self._v[: self.rows, :, self.length : self.length + t] = value_states
        self.length += t
        self.keys = self._k[: self.rows, :, : self.length]
        self.values = self._v[: self.rows, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices) -> None:
        """Any reorder/subset (the prefix-sharing prefill copies a group's rows to its members):
        one gather into fresh buffers of the same capacity."""
        if not self.is_initialized or self._k is None:
            return
        self._k, self._v = self._k[indices], self._v[indices]
        self.rows = len(indices)
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def move_row(self, src: int, dst: int) -> None:
        self._k[dst, :, : self.length] = self._k[src, :, : self.length]
        self._v[dst, :, : self.length] = self._v[src, :, : self.length]

    def shrink(self, rows: int) -> None:
        self.rows = rows
        self.keys, self.values = self._k[:rows, :, : self.length], self._v[:rows, :, : self.length]

    def admit(self, other: "GrowingLayer") -> None:
        """Append `other`'s rows after the live ones, right-aligned: both end at the same column."""
        if other.length > self.length:  # a longer prompt: every live row moves right
            shift = other.length - self.length
            self._reserve(other.length, shift=shift)
            self.length = other.length
        n, start = other.rows, self.length - other.length
        self._reserve(self.length, rows=self.rows + n)
        new = slice(self.rows, self.rows + n)
        self._k[new, :, :start] = 0  # never read (masked), but must not be NaN garbage either
        self._v[new, :, :start] = 0
        self._k[new, :, start : self.length] = other._k[:n, :, : other.length]
        self._v[new, :, start : self.length] = other._v[:n, :, : other.length]
        self.rows += n
        self.shrink(self.rows)

    def drop_front(self, n: int) -> None:
        """Forget the first n columns (no live row attends to them any more)."""
        rows, keep = self.rows, self.length - n
        self._k[:rows, :, :keep] = self._k[:rows, :, n : self.length].clone()
        self._v[:rows, :, :keep] = self._v[:rows, :, n : self.length].clone()
        self.length = keep
        self.shrink(rows)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the decoder's cache never drops tokens")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("the decoder's cache is not used for beam search")


class GrowingCache(DynamicCache):
    """A `DynamicCache` whose layers are `GrowingLayer`s (see the module docstring), created as
    the model first writes to each."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    @staticmethod
    def fits(model) -> bool:
        """Full attention in every layer: a sliding-window layer (Mistral, Gemma) keeps
        transformers' own cache, whose window this one does not implement."""
        config = getattr(model, "config", None)
        if config is None:
            return False
        config = config.get_text_config(decoder=True)
        types = getattr(config, "layer_types", None)
        if types:
            return all(t == "full_attention" for t in types)
        return not getattr(config, "sliding_window", None)

    def admit(self, other: "GrowingCache") -> None:
        """Rows of `other` (a fresh cache of prefilled waiting prompts) join this one; see the
        module docstring. The decoder widens its attention mask the same way."""
        for mine, theirs in zip(self.layers, other.layers):
            mine.admit(theirs)

    def drop_front(self, n: int) -> None:
        for layer in self.layers:
            if layer.is_initialized:
                layer.drop_front(n)

    def compact(self, keep: list[int]) -> list[int]:
        """Keep the rows at slots `keep` (ascending); returns, for each new slot, the old slot now
        there. Freed slots below the new batch size are filled with the last live rows, so only
        the moved rows are copied."""
        kept = set(keep)
        order = list(range(len(keep)))
        holes = [s for s in range(len(keep)) if s not in kept]  # freed slots inside the new batch
        movers = [s for s in keep if s >= len(keep)]  # live rows beyond it
        for hole, src in zip(holes, movers):
            order[hole] = src
            for layer in self.layers:
                if layer.is_initialized:
                    layer.move_row(src, hole)
        for layer in self.layers:
            if layer.is_initialized:
                layer.shrink(len(keep))
        return order
