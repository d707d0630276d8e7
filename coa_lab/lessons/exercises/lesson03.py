"""Lesson 03's exercises: what the mask hides, what one epoch trains on, the masked loss by hand."""

from __future__ import annotations

from coa_lab.lessons.exercises.registry import Exercise, register


def _masked_split(enc) -> list[int]:
    from coa_lab.training.sft import IGNORE_INDEX

    labels = list(enc["labels"])
    trained = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    prompt = trained[0] if trained else len(labels)  # the trajectory's first block is the model's, so trained
    return [prompt, sum(1 for label in labels[prompt:] if label == IGNORE_INDEX)]


register(Exercise(
    id="03.masked_split",
    question="Of the example's masked tokens (label -100 in `enc`), how many are masked because they are the "
             "prompt, and how many because they are observations? Answer [prompt, observation].",
    truth=_masked_split,
    hint="the prompt is the run of -100 before the first trained token; every -100 after it overlaps an "
         "<observation> span.",
    wrong=lambda right: [right[0] - 1, right[1] + 1],  # one token on the wrong side of the boundary
))


def _trained_tokens(records, tok, preset) -> int:
    from coa_lab.training.sft import IGNORE_INDEX, encode_example, record_messages

    total = 0
    for rec in records:  # encoded exactly as train_sft encodes them: cut to sft.max_length
        enc = encode_example(tok, record_messages(rec), rec.text, preset.sft.max_length,
                             mask_observations=preset.sft.mask_observations)
        total += sum(1 for label in enc["labels"] if label != IGNORE_INDEX)
    return total


register(Exercise(
    id="03.trained_tokens",
    question="How many tokens does one epoch of the lesson's SFT run train on (tokens with a label, over all of "
             "`kept`)? Compute it with encode_example, before you look at `result`.",
    truth=_trained_tokens,
    hint="train_sft encodes each record with the preset's sft.max_length: an example longer than that is cut, "
         "and its cut-off tokens are not trained.",
    wrong=lambda right: right + 1,
))


register(Exercise(
    id="03.loss_by_hand",
    question="Compute the masked loss of the padded batch (`padded`) by hand: the model's logits, the labels "
             "shifted by one, cross-entropy over the labelled positions only. It must equal `loss_padded`.",
    truth=lambda loss: float(loss),  # masked_lm_loss's value, computed by the lesson on the same batch
    hint="position t predicts token t+1: compare logits[:, :-1] with labels[:, 1:], skip label -100, and take "
         "the mean over the labelled tokens of the whole batch (not per example).",
    wrong=lambda right: right + 0.01,
    same=lambda a, b: abs(float(a) - float(b)) <= 1e-4 * max(1.0, abs(float(b))),
))
