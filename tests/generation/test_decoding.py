"""The cache-keeping multi-turn decoder (coa_lab.generation.decoding) against transformers itself."""

import pytest
import torch

from coa_lab.config import ModelConfig
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.decoding import decode
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.models import load_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model_tok():
    return load_model(ModelConfig())


def _prompts(tok, questions):
    return [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]


def _hf_greedy(model, tok, prompt, n):
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    row = out[0, len(prompt):].tolist()
    return row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row


def test_greedy_matches_transformers_generate_in_a_padded_batch(model_tok):
    model, tok = model_tok
    prompts = _prompts(tok, ["Say hi.", "Write a sentence about the sea and the moon.", "What is 2+2?"])
    gens = HFGenerator(model, tok, batch_size=3).generate(prompts, max_new_tokens=16)
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == _hf_greedy(model, tok, prompt, 16)
        assert gen.prompt_tokens == len(prompt)


def test_stop_string_ends_the_turn_at_the_token_that_completes_it(model_tok):
    model, tok = model_tok
    prompt = _prompts(tok, ["Count from 1 to 20, separated by commas."])[0]
    full = HFGenerator(model, tok).generate([prompt], max_new_tokens=40)[0]
    text = full.text
    assert "5" in text, text  # the model counts; pick a stop string it will produce
    gen = HFGenerator(model, tok).generate([prompt], max_new_tokens=40, stop=["5"])[0]
    assert gen.finish_reason == "stop"
    assert "5" in tok.decode(gen.token_ids) and "5" not in tok.decode(gen.token_ids[:-1])
    assert gen.token_ids == full.token_ids[: len(gen.token_ids)]


def test_forced_tokens_continue_from_the_kept_cache_exactly_like_a_fresh_prefill(model_tok):
    """Turn 1 -> forced observation -> turn 2, in one pass, must equal decoding turn 2 from
    scratch on the whole prefix (what the re-prefilling loop would do)."""
    model, tok = model_tok
    prompts = _prompts(tok, ["Name three fruits.", "Tell me about Paris in one sentence."])
    forced = tok("\nObservation: the tool says 42.\n", add_special_tokens=False)["input_ids"]
    turns: dict[int, list] = {0: [], 1: []}

    def on_end(events):
        replies = []
        for i, gen in events:
            turns[i].append(gen)
            replies.append(forced if len(turns[i]) == 1 else None)
        return replies

    decode(model, tok, prompts, on_end, max_new_tokens=8, batch_size=2)
    for i, prompt in enumerate(prompts):
        first, second = turns[i]
        assert first.finish_reason in ("length", "eos")
        if first.finish_reason == "eos":
            continue
        assert second.prompt_tokens == len(prompt) + len(first.token_ids) + len(forced)
        prefix = prompt + first.token_ids + forced
        assert second.token_ids == _hf_greedy(model, tok, prefix, 8)


def test_response_budget_counts_forced_tokens_and_rows_leave_the_batch(model_tok):
    model, tok = model_tok
    prompts = _prompts(tok, ["Describe a tree.", "Describe a river.", "Describe a cat."])
    calls = {i: 0 for i in range(3)}

    def on_end(events):
        out = []
        for i, gen in events:
            calls[i] += 1
            # row 0 stops at once, the others get a 5-token observation each turn
            out.append(None if i == 0 else [tok.eos_token_id - 1] * 5)
        return out

    decode(model, tok, prompts, on_end, max_new_tokens=4, max_response_tokens=20, batch_size=3)
    assert calls[0] == 1
    # each later turn costs at most 4 sampled + 5 forced tokens: 20 allows 3 turns
    assert calls[1] == calls[2] == 3


def test_bad_on_turn_end_reply_is_a_clear_error(model_tok):
    model, tok = model_tok
    with pytest.raises(ValueError, match="replies"):
        decode(model, tok, _prompts(tok, ["Hi."]), lambda events: [], max_new_tokens=2)


def test_lora_is_merged_only_while_decoding(model_tok):
    from coa_lab.generation.models import add_lora

    model, tok = load_model(ModelConfig())
    model = add_lora(model, ModelConfig())
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for p in lora_b:
            p.normal_(0, 0.5)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora" not in n}
    prompt = _prompts(tok, ["Say hi."])[0]
    gen = HFGenerator(model, tok).generate([prompt], max_new_tokens=8)[0]
    with model.disable_adapter():
        plain = HFGenerator(model, tok).generate([prompt], max_new_tokens=8)[0]
    # the adapter was applied (output differs from the base model's) ...
    with torch.no_grad():
        unmerged = model(input_ids=torch.tensor([prompt + gen.token_ids[:-1]])).logits[0, len(prompt) - 1:].argmax(-1)
    assert unmerged.tolist() == gen.token_ids
    assert gen.token_ids != plain.token_ids  # a large random adapter changes the output
    # ... and unmerged afterwards: base weights back to their values
    for n, p in model.named_parameters():
        if "lora" not in n:
            assert torch.allclose(p, base[n], atol=1e-5), n


def test_shared_prefix_groups_split_sorted_prompts():
    from coa_lab.generation.decoding import shared_prefix_groups

    a = list(range(100))
    prompts = sorted([a + [1, 2], a + [1, 3, 4], a[:60] + [7], [5, 6, 7]])
    # a[:60]+[7] shares 60 tokens with the others, [5,6,7] nothing
    assert shared_prefix_groups(prompts, min_shared=48) == [(3, 60), (1, 2)]
    assert shared_prefix_groups(prompts, min_shared=80) == [(1, 60), (2, 101), (1, 2)]


def test_groups_keep_worked_examples_shared_not_just_the_instruction():
    """Team prompts: one instruction (50 tokens) for all, then one of three worked-example
    blocks (250 tokens), then the task (10 tokens). One group sharing only the instruction
    would leave 260-token suffixes on every row; the cost-based cut groups by examples."""
    from coa_lab.generation.decoding import shared_prefix_groups

    instruction = list(range(50))
    blocks = [[1000 + 300 * b + i for i in range(250)] for b in range(3)]
    prompts = sorted(instruction + blocks[t % 3] + [5000 + 10 * t + i for i in range(10)] for t in range(12))
    groups = shared_prefix_groups(prompts, min_shared=48)
    assert [size for size, _ in groups] == [4, 4, 4]
    assert all(shared == 300 for _, shared in groups)


def test_prompts_sharing_nothing_long_are_not_grouped():
    from coa_lab.generation.decoding import shared_prefix_groups

    prompts = sorted([[t] + list(range(100, 140)) for t in range(5)])
    assert shared_prefix_groups(prompts, min_shared=48) == [(1, 40)] * 5


def test_a_shared_prefix_is_prefilled_once_with_the_same_greedy_output(model_tok):
    """Team agents share a long instruction + worked examples; the decoder prefills it once
    and copies the cache rows. Output must equal decoding each prompt on its own."""
    model, tok = model_tok
    system = "You are the thinker of a team. " + "Read the task, say what to compute, keep it short. " * 6
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in ("What is 12 times 7?", "Add 5 and 9.", "Who wrote Hamlet?")]
    convs.append([{"role": "user", "content": "Name a colour."}])  # shares nothing: its own group
    prompts = [chat_prompt_ids(tok, c) for c in convs]
    gens = HFGenerator(model, tok, batch_size=4).generate(prompts, max_new_tokens=10)
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == _hf_greedy(model, tok, prompt, 10)




def test_prompts_beyond_one_batch_wait_for_free_slots(model_tok):
    """5 prompts at batch_size 4: 4 start, the fifth waits for a slot (never 5 rows at once),
    and is decoded like the others."""
    model, tok = model_tok
    prompts = _prompts(tok, [f"Say the number {n}." for n in range(5)])
    widths = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: widths.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        gens = HFGenerator(model, tok, batch_size=4).generate(prompts, max_new_tokens=3)
    finally:
        hook.remove()
    assert max(widths) == 4 and widths[0] == 4 and 1 in widths, widths
    for prompt, gen in zip(prompts, gens):
        assert gen.token_ids == _hf_greedy(model, tok, prompt, 3)


def test_waiting_prompts_join_rows_mid_decode_exactly(model_tok, monkeypatch):
    """Continuous batching: rows end at different steps, waiting prompts (shorter and longer
    than the cache at that moment) are prefilled and join the live rows, dead left columns are
    trimmed; every turn equals decoding that prompt alone."""
    from coa_lab.generation import decoding

    from coa_lab.generation.kv_cache import GrowingLayer

    # trim as soon as any column is dead, to exercise it on short prompts
    monkeypatch.setattr(decoding, "TRIM_MIN", 1)
    monkeypatch.setattr(decoding, "TRIM_FRACTION", 10**6)
    seen = {"admit": 0, "longer": 0, "trim": 0}
    admit, drop = GrowingLayer.admit, GrowingLayer.drop_front

    def spy_admit(self, other):
        seen["admit"] += 1
        seen["longer"] += other.length > self.length  # the live rows had to move right
        return admit(self, other)

    def spy_drop(self, n):
        seen["trim"] += 1
        return drop(self, n)

    monkeypatch.setattr(GrowingLayer, "admit", spy_admit)
    monkeypatch.setattr(GrowingLayer, "drop_front", spy_drop)
    model, tok = model_tok
    long = "Please read this twice. " * 12
    questions = ["A fruit?", long + "Describe the sea.", "B?", long + "Name a colour.", "C: say hi.", "D: 2+2?"]
    prompts = _prompts(tok, questions)
    forced = tok("\nObservation: 42.\n", add_special_tokens=False)["input_ids"]

    def run(subset, batch_size):
        turns = {i: [] for i in subset}

        def on_end(events):
            out = []
            for k, gen in events:
                i = subset[k]
                turns[i].append(gen.token_ids)
                # odd prompts take one observation and a second turn: rows leave at different steps
                out.append(forced if i % 2 and len(turns[i]) == 1 else None)
            return out

        decode(model, tok, [prompts[i] for i in subset], on_end, max_new_tokens=5, batch_size=batch_size)
        return turns

    widths = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: widths.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        together = run(list(range(len(prompts))), 2)
    finally:
        hook.remove()
    alone = {i: run([i], 1)[i] for i in range(len(prompts))}
    assert together == alone
    assert seen["admit"] and seen["longer"] and seen["trim"], seen
    first_decode = next(k for k, (_, t) in enumerate(widths) if t == 1)
    assert any(t > 1 for _, t in widths[first_decode:]), "no waiting prompt was prefilled while rows decoded"
    assert max(r for r, _ in widths) <= 2


def test_rows_at_their_own_temperatures_greedy_rows_as_alone_and_only_sampled_rows_keep_logprobs(model_tok):
    model, tok = model_tok
    prompts = _prompts(tok, ["Say hi.", "What is 2+2?", "Name a colour."])
    greedy = HFGenerator(model, tok, batch_size=3).generate(prompts, max_new_tokens=12)
    out: dict[int, object] = {}

    def keep(events):
        out.update(events)
        return [None] * len(events)

    torch.manual_seed(0)
    decode(model, tok, prompts, keep, max_new_tokens=12, temperature=[0.0, 1.0, 0.0], batch_size=3)
    assert out[0].token_ids == greedy[0].token_ids and out[2].token_ids == greedy[2].token_ids
    assert out[0].logprobs is None and out[2].logprobs is None
    assert out[1].logprobs is not None and len(out[1].logprobs) == len(out[1].token_ids)
    with pytest.raises(ValueError, match="temperatures for 3 prompts"):
        decode(model, tok, prompts, keep, max_new_tokens=4, temperature=[0.0, 1.0], batch_size=3)
