"""coa_lab/training/sft.py: observation masking in `encode_example` and `pad_batch`, with the real
(embedded SmolLM2) tokenizer.

The checks do NOT trust the tokenizer's offset_mapping (that is what encode_example uses):
each token's true extent is recomputed from its byte-level BPE piece (GPT-2 byte<->unicode
table), so "which characters does this token really contain" is an independent oracle.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coa_lab import protocol
from coa_lab.training.sft import IGNORE_INDEX, encode_example, pad_batch

pytestmark = pytest.mark.model

MESSAGES = [{"role": "system", "content": "You are a CoA agent."}, {"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def tok():
    from coa_lab.generation.models import load_tokenizer

    return load_tokenizer("embedded")


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


def token_byte_spans(tok, ids: list[int], full: str) -> list[tuple[int, int]]:
    """True byte extent of each token in full.encode('utf-8'), from the BPE pieces."""
    added = set(tok.get_added_vocab())
    out, pos, chunks = [], 0, []
    for piece in tok.convert_ids_to_tokens(ids):
        raw = piece.encode("utf-8") if piece in added else bytes(_BYTE_DECODER[c] for c in piece)
        out.append((pos, pos + len(raw)))
        chunks.append(raw)
        pos += len(raw)
    assert b"".join(chunks) == full.encode("utf-8"), "token pieces do not reassemble the text"
    return out


def char_to_byte(text: str) -> list[int]:
    """Byte offset of every character boundary (len(text) + 1 entries)."""
    offs = [0]
    for ch in text:
        offs.append(offs[-1] + len(ch.encode("utf-8")))
    return offs


def analyse(tok, trajectory: str, obs_char_spans, max_length=None):
    """Encode and return (example, prompt, full, per-token info) with the true overlap flags."""
    ex = encode_example(tok, MESSAGES, trajectory, max_length)
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    full = prompt + trajectory + tok.eos_token
    all_ids = tok(full, add_special_tokens=False)["input_ids"]
    spans = token_byte_spans(tok, all_ids, full)
    c2b = char_to_byte(full)
    p_end = c2b[len(prompt)]
    obs_bytes = [(c2b[len(prompt) + s], c2b[len(prompt) + e]) for s, e in obs_char_spans]
    info = []
    for tid, (b0, b1) in zip(all_ids, spans):
        in_prompt = b0 < p_end
        in_obs = any(b0 < e and b1 > s for s, e in obs_bytes)
        info.append((tid, b0, b1, in_prompt, in_obs))
    return ex, prompt, full, all_ids, info


def _assert_mask_exact(ex, info):
    assert len(ex["labels"]) == len(ex["input_ids"])
    for k, (label, (tid, b0, b1, in_prompt, in_obs)) in enumerate(zip(ex["labels"], info)):
        assert ex["input_ids"][k] == tid
        if in_prompt or in_obs:
            assert label == IGNORE_INDEX, f"token {k} bytes {b0}:{b1} overlaps prompt/observation but is trained"
        else:
            assert label == tid, f"token {k} bytes {b0}:{b1} is trajectory text but masked"


def _traj():
    return (
        "<think>I should search.</think>\n<wiki_search>capital of France</wiki_search>"
        + protocol.wrap_observation("Paris is the capital </ of France > 😀 ünïcode")
        + "<think>It is Paris.</think>\n<wiki_search>population of Paris</wiki_search>"
        + protocol.wrap_observation("about 2.1 million")
        + "<answer>Paris</answer>"
    )


def test_labels_mask_prompt_and_observations_exactly(tok):
    traj = _traj()
    spans = protocol.observation_spans(traj)
    assert len(spans) == 2
    ex, prompt, full, ids, info = analyse(tok, traj, spans)
    assert ex["input_ids"] == ids
    _assert_mask_exact(ex, info)
    # there really is something on each side
    assert any(in_obs for *_, in_obs in info)
    assert any(not p and not o for _, _, _, p, o in info)
    assert ex["n_observation_tokens"] == sum(1 for *_, p, o in info if o and not p)


def test_unmasked_tokens_decode_to_trajectory_minus_observations(tok):
    traj = _traj()
    spans = protocol.observation_spans(traj)
    ex, prompt, full, ids, info = analyse(tok, traj, spans)
    # Expected: the trajectory with each "<observation>...</observation>" removed, plus EOS.
    # wrap_observation puts "\n" on both sides of the block and the tokenizer keeps that
    # newline as its own token ('Ċ'), so no boundary character is lost: exact equality.
    expected, last = "", 0
    for s, e in spans:
        expected += traj[last:s]
        last = e
    expected += traj[last:] + tok.eos_token
    kept_bytes = b"".join(full.encode("utf-8")[b0:b1] for (lab, (_, b0, b1, _, _)) in zip(ex["labels"], info)
                          if lab != IGNORE_INDEX)
    assert kept_bytes.decode("utf-8") == expected
    kept_ids = [lab for lab in ex["labels"] if lab != IGNORE_INDEX]
    assert tok.decode(kept_ids, skip_special_tokens=False) == expected
    # and none of the observation text leaks
    decoded = tok.decode(kept_ids)
    for word in ("Paris is the capital", "million", "observation", "😀"):
        assert word not in decoded


def test_boundary_token_straddling_observation_is_masked(tok):
    # no newline padding: the closing '>' is glued to following text, so a token may straddle
    traj = "<code>print(1)</code><observation>1</observation>>>x<answer>1</answer>"
    spans = protocol.observation_spans(traj)
    assert [traj[s:e] for s, e in spans] == ["<observation>1</observation>"]
    ex, prompt, full, ids, info = analyse(tok, traj, spans)
    _assert_mask_exact(ex, info)
    # every character lost from the trained text is adjacent to the span (inside a straddling token)
    trained = b"".join(full.encode()[b0:b1] for lab, (_, b0, b1, _, _) in zip(ex["labels"], info) if lab != IGNORE_INDEX)
    assert trained.decode().endswith("x<answer>1</answer>" + tok.eos_token)
    assert trained.decode().startswith("<code>print(1)</code")


def test_prompt_is_fully_masked_and_trajectory_starts_training(tok):
    traj = "<think>t</think><answer>a</answer>"
    ex, prompt, full, ids, info = analyse(tok, traj, [])
    n_prompt = sum(1 for *_, p, _ in info if p)
    assert n_prompt == len(tok(prompt, add_special_tokens=False)["input_ids"])  # clean boundary
    assert all(lab == IGNORE_INDEX for lab in ex["labels"][:n_prompt])
    assert all(lab != IGNORE_INDEX for lab in ex["labels"][n_prompt:])
    assert ex["n_observation_tokens"] == 0


def test_final_eos_is_trained(tok):
    ex = encode_example(tok, MESSAGES, _traj())
    assert ex["input_ids"][-1] == tok.eos_token_id
    assert ex["labels"][-1] == tok.eos_token_id
    # exactly one EOS at the end of the trajectory (the prompt has its own <|im_end|> tokens, masked)
    assert ex["labels"].count(tok.eos_token_id) == 1


def test_trajectory_ending_in_observation_still_trains_eos(tok):
    traj = "<think>t</think><wiki_search>q</wiki_search>" + protocol.wrap_observation("o")
    ex = encode_example(tok, MESSAGES, traj)
    assert ex["labels"][-1] == tok.eos_token_id


def test_truncation(tok):
    full = encode_example(tok, MESSAGES, _traj())
    n = len(full["input_ids"])
    for m in (1, 10, n - 5, n, n + 50):
        ex = encode_example(tok, MESSAGES, _traj(), max_length=m)
        assert len(ex["input_ids"]) == len(ex["labels"]) == min(m, n)
        assert ex["input_ids"] == full["input_ids"][:m]
        assert ex["labels"] == full["labels"][:m]
    short = encode_example(tok, MESSAGES, _traj(), max_length=n - 1)
    assert short["input_ids"][-1] != tok.eos_token_id or short["input_ids"][-2] == tok.eos_token_id


def test_record_messages_prompt(tok):
    from coa_lab.training.sft import record_messages
    from coa_lab.trajectories import TrajectoryRecord

    rec = TrajectoryRecord(id="a", task_id="b", source="t", profile="mhqa", question="Capital of France?",
                           answers=["Paris"], text=_traj())
    msgs = record_messages(rec)
    assert msgs[-1] == {"role": "user", "content": "Capital of France?"}
    assert "wiki_search" in msgs[0]["content"]
    ex = encode_example(tok, msgs, rec.text)
    assert ex["labels"][-1] == tok.eos_token_id


# ============================================================================ pad_batch


def test_pad_batch():
    import torch

    rows = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
        {"input_ids": [8], "labels": [8]},
        {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]},
    ]
    b = pad_batch(rows, pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]]
    assert b["labels"].tolist() == [[-100, 6, 7, -100], [8, -100, -100, -100], [-100, -100, 3, 4]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert b["input_ids"].dtype == torch.long and b["labels"].dtype == torch.long
    assert rows[1] == {"input_ids": [8], "labels": [8]}  # inputs untouched


def test_pad_batch_real_examples(tok):
    rows = [encode_example(tok, MESSAGES, _traj()), encode_example(tok, MESSAGES, "<answer>x</answer>")]
    for r in rows:
        r.pop("n_observation_tokens")
    b = pad_batch(rows, tok.pad_token_id)
    n0, n1 = len(rows[0]["input_ids"]), len(rows[1]["input_ids"])
    assert b["input_ids"].shape == (2, max(n0, n1))
    assert b["attention_mask"].sum(dim=1).tolist() == [n0, n1]
    assert (b["labels"][1, n1:] == IGNORE_INDEX).all()


# ============================================================================ property


_KNOWN = set(protocol.ROLE_TAGS) | set(protocol.DEFAULT_TOOLS) | {"observation"}
_odd = st.sampled_from(["</", ">", "<", "</ob", "servation>", "<b>", "é", "ü", "😀", "中文", "\u0301", "\t", "\n\n",
                        "  ", "<|im_end|>", "<filename>", "Ġ", "Ċ", "\\", "{}"])
# The embedded (GGUF-converted) vocab lacks the byte tokens for a few control characters and
# for UTF-8 lead bytes 0xF1/0xF2 (U+40000..U+BFFFF): those become <|endoftext|> (unk), which
# the byte oracle below cannot map back to text, so they are left out of the alphabet.
_chars = st.characters(max_codepoint=0x3FFFF, blacklist_categories=("Cs",),
                       blacklist_characters="\x04\x06\x13\x14\x16\x1d")
_content = st.lists(st.one_of(st.text(_chars, max_size=6), _odd), max_size=6).map("".join).filter(
    lambda s: not any(m.group(2).lower() in _KNOWN for m in protocol._TAG_RE.finditer(s)))


@st.composite
def trajectory_with_observations(draw):
    """(text, intended observation spans) built piece by piece; the spans come from the
    construction, not from protocol.observation_spans."""
    text, obs = draw(st.sampled_from(["", "\n", " "])), []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["role", "tool", "obs_wrapped", "obs_raw"]))
        content = draw(_content)
        if kind == "role":
            text += protocol.block(draw(st.sampled_from(protocol.ROLE_TAGS[:-1])), content)
        elif kind == "tool":
            text += protocol.block(draw(st.sampled_from(protocol.DEFAULT_TOOLS)), content)
        else:
            piece = protocol.wrap_observation(content) if kind == "obs_wrapped" else protocol.block("observation", content)
            s = text.__len__() + piece.index("<observation>")
            e = text.__len__() + piece.rindex("</observation>") + len("</observation>")
            obs.append((s, e))
            text += piece
    text += protocol.block("answer", draw(_content))
    return text, obs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(trajectory_with_observations())
def test_no_observation_character_in_an_unmasked_token(tok, sample):
    traj, obs = sample
    # the parser agrees with the construction (else the sample is not about masking)
    assert protocol.observation_spans(traj) == obs
    ex, prompt, full, ids, info = analyse(tok, traj, obs)
    for label, (tid, b0, b1, in_prompt, in_obs) in zip(ex["labels"], info):
        if in_obs:
            assert label == IGNORE_INDEX, (full.encode()[b0:b1], traj)
    _assert_mask_exact(ex, info)
    assert ex["labels"][-1] == tok.eos_token_id


def test_mask_off_keeps_observation_labels_and_nothing_else_changes(tok):
    # the ablation arm of notebook 07: observation tokens are trained, the prompt stays masked
    traj = _traj()
    on = encode_example(tok, MESSAGES, traj)
    off = encode_example(tok, MESSAGES, traj, mask_observations=False)
    assert off["input_ids"] == on["input_ids"]
    assert off["n_observation_tokens"] == on["n_observation_tokens"] > 0
    newly_trained = [i for i, (a, b) in enumerate(zip(on["labels"], off["labels"])) if a != b]
    assert len(newly_trained) == on["n_observation_tokens"]
    assert all(on["labels"][i] == IGNORE_INDEX and off["labels"][i] == off["input_ids"][i] for i in newly_trained)
