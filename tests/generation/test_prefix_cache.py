"""Shared prompt prefixes kept across decode calls (coa_lab/generation/prefix_cache.py): the cache's own
rules, and the decoder reusing a prefix with the same greedy output as a fresh prefill."""

import pytest
import torch

from coa_lab.generation.prefix_cache import PrefixCache


def _layers(n, value=0.0):
    return [(torch.full((1, 2, n, 4), value), torch.full((1, 2, n, 4), -value))]


def test_lookup_returns_the_longest_match_and_ignores_short_ones():
    cache = PrefixCache(min_reuse=4)
    cache.store(list(range(10)), _layers(10, 1.0))
    cache.store([0, 1, 2, 9, 9, 9, 9, 9], _layers(8, 2.0))
    m, layers = cache.lookup(list(range(7)) + [42])
    assert m == 7 and layers[0][0][0, 0, 0, 0] == 1.0  # a shorter prompt agreeing on 7 tokens
    assert cache.lookup([0, 1, 2, 5, 5]) == (0, None)  # 3 tokens in common: below min_reuse


def test_an_extended_prefix_replaces_its_shorter_entry_and_a_covered_one_is_not_stored():
    cache = PrefixCache(min_reuse=4)
    cache.store(list(range(6)), _layers(6))
    cache.store(list(range(9)), _layers(9))
    assert list(cache.entries) == [tuple(range(9))]
    cache.store(list(range(5)), _layers(5))
    assert list(cache.entries) == [tuple(range(9))]


def test_least_recently_used_entries_go_beyond_the_token_budget():
    cache = PrefixCache(max_tokens=20, min_reuse=4)
    a, b, c = [1] * 8, [2] * 8, [3] * 8
    cache.store(a, _layers(8))
    cache.store(b, _layers(8))
    cache.lookup(a)  # a used again: b is now the oldest
    cache.store(c, _layers(8))
    assert set(cache.entries) == {tuple(a), tuple(c)} and cache.tokens() == 16


def test_entries_are_dropped_when_the_weights_change():
    model = torch.nn.Linear(2, 2)
    cache = PrefixCache(min_reuse=4)
    cache.check(model)
    cache.store([1] * 6, _layers(6))
    cache.check(model)
    assert cache.entries  # same weights: kept
    with torch.no_grad():
        model.weight.add_(1.0)  # an optimizer step, a LoRA merge: the version counter moves
    cache.check(model)
    assert not cache.entries


@pytest.mark.model
def test_a_prefix_from_an_earlier_call_is_not_prefilled_again_and_output_is_unchanged():
    from coa_lab.config import ModelConfig
    from coa_lab.generation.chat_prompt import chat_prompt_ids
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import load_model

    model, tok = load_model(ModelConfig())
    system = "You are the thinker of a team. " + "Read the task, say what to compute, keep it short. " * 8

    def prompts(questions):
        return [chat_prompt_ids(tok, [{"role": "system", "content": system}, {"role": "user", "content": q}])
                for q in questions]

    first = prompts(["What is 12 times 7?", "Add 5 and 9.", "Who wrote Hamlet?"])
    second = prompts(["What is 3 plus 4?", "Name a river in Africa.", "Subtract 2 from 11."])
    plain = HFGenerator(model, tok, batch_size=4)
    keeping = HFGenerator(model, tok, batch_size=4, keep_prefixes=True)
    want = [g.token_ids for g in plain.generate(second, max_new_tokens=12)]
    keeping.generate(first, max_new_tokens=12)
    sent, prefilled = keeping.stats["prompt_tokens_sent"], keeping.stats["prompt_tokens_prefilled"]
    assert sent == sum(map(len, first)) and prefilled < sent  # within one call: the group's prefix once
    assert keeping.prefix_cache.entries
    got = [g.token_ids for g in keeping.generate(second, max_new_tokens=12)]
    assert got == want
    second_prefilled = keeping.stats["prompt_tokens_prefilled"] - prefilled
    shared = min(len(p) for p in second) - 12  # the system prompt alone is well over 100 tokens
    # the second call computed only what no cached prefix covered: each row's own question
    assert second_prefilled <= sum(map(len, second)) - 3 * shared
    # a single prompt alone (no group to share within) still starts from the cached prefix
    before = keeping.stats["prompt_tokens_prefilled"]
    lone = prompts(["Spell the word cat."])
    assert keeping.generate(lone, max_new_tokens=8)[0].token_ids == plain.generate(lone, max_new_tokens=8)[0].token_ids
    assert keeping.stats["prompt_tokens_prefilled"] - before < len(lone[0]) // 2
