"""Lesson 03's exercises: what the mask hides, what one epoch trains on, the masked loss by hand.

No answer is a number the lesson already prints or holds: each one asks for something the cells
above do not compute (per observation block, per example), so echoing a lesson object
(`enc["n_observation_tokens"]`, `result.trained_tokens`, `loss_padded`) does not pass."""

from __future__ import annotations

from coa_lab import protocol
from coa_lab.lessons.exercises.registry import Exercise, register
from coa_lab.training.sft import IGNORE_INDEX, encode_example, record_messages


def most_observed(records):
    """The first record of `records` with the most <observation> blocks."""
    return max(records, key=lambda rec: len(protocol.observation_spans(rec.text)))


def _tokens_per_observation(records, tok) -> list[int]:
    """Tokens the mask hides in each observation block of `most_observed(records)`: those whose
    characters overlap the block (encode_example's rule), counted from the tokenizer's offsets."""
    rec = most_observed(records)
    prompt = tok.apply_chat_template(record_messages(rec), add_generation_prompt=True, tokenize=False)
    offsets = tok(prompt + rec.text + (tok.eos_token or ""), add_special_tokens=False,
                  return_offsets_mapping=True)["offset_mapping"]
    return [sum(1 for a, b in offsets if a < e + len(prompt) and b > s + len(prompt))
            for s, e in protocol.observation_spans(rec.text)]


register(Exercise(
    id="03.masked_split",
    question="Take the trajectory of `kept` with the most <observation> blocks (the first such one: "
             "`max(kept, key=...)`). Encode it with encode_example: how many tokens does the mask hide in each of "
             "its observation blocks? Answer one count per block, in order.",
    truth=_tokens_per_observation,
    hint="after the prompt, every run of label -100 is one observation block (the model's own words, trained, "
         "sit between two blocks); count each run. Their sum is that example's enc[\"n_observation_tokens\"].",
    wrong=lambda right: [right[0] + 1, *right[1:]],  # one token on the wrong side of a block's boundary
))


def _trained_per_example(records, tok, preset) -> list[int]:
    counts = []
    for rec in records:  # encoded exactly as train_sft encodes them: cut to sft.max_length
        enc = encode_example(tok, record_messages(rec), rec.text, preset.sft.max_length,
                             mask_observations=preset.sft.mask_observations)
        counts.append(sum(1 for label in enc["labels"] if label != IGNORE_INDEX))
    return counts


register(Exercise(
    id="03.trained_tokens",
    question="Encode each trajectory of `kept` as train_sft does and count its trained tokens (labels that are not "
             "-100). Answer [the most any one example trains on, the fewest]. The sum over `kept` must be "
             "`result.trained_tokens`.",
    truth=lambda records, tok, preset: (lambda c: [max(c), min(c)])(_trained_per_example(records, tok, preset)),
    hint="train_sft encodes each record with the preset's sft.max_length (and sft.mask_observations): an example "
         "longer than that is cut, and its cut-off tokens are not trained.",
    wrong=lambda right: [right[0] + 1, right[1]],
))


def _loss_per_example(model, batch) -> list[float]:
    """Each example's mean next-token cross-entropy over its own labelled tokens."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"].to(device),
                       attention_mask=batch["attention_mask"].to(device)).logits.float()  # [B, L, V]
    labels = batch["labels"][:, 1:].to(device)  # [B, L-1]: position t predicts token t + 1
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, ignore_index=IGNORE_INDEX,
                                            reduction="none")  # [B, L-1]
    on = labels != IGNORE_INDEX  # [B, L-1]
    return ((nll * on).sum(dim=1) / on.sum(dim=1).clamp(min=1)).tolist()  # [B]


register(Exercise(
    id="03.loss_by_hand",
    question="By hand, the masked loss of each example of the padded batch (`padded`): the model's logits, the "
             "labels shifted by one, cross-entropy over that example's labelled positions. Answer one loss per "
             "example; weighted by their labelled-token counts they average to `loss_padded`.",
    truth=_loss_per_example,
    hint="position t predicts token t+1: compare logits[:, :-1] with labels[:, 1:], skip label -100, and take each "
         "row's mean over its own labelled tokens (reduction='none', then sum per row / count per row).",
    wrong=lambda right: [right[0] + 0.01, *right[1:]],
    same=lambda a, b: len(a) == len(b) and all(abs(float(x) - float(y)) <= 1e-4 * max(1.0, abs(float(y)))
                                               for x, y in zip(a, b)),
))
