"""coa_lab/protocol.py: parse/render round trip, tolerant parsing, the validate grammar, and
the rollout helpers (stop strings, observation spans, pending tool call, final answer).

The expected grammar tables below are written out by hand from docs/paper-facts.md and the
module's docstring (not imported from the module), so a change to `protocol.GRAMMAR` that
breaks the documented format fails here.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coa_lab import protocol
from coa_lab.protocol import (
    DEFAULT_TOOLS,
    ROLE_TAGS,
    final_answer,
    observation_spans,
    parse,
    pending_tool_call,
    render,
    stop_strings,
    validate,
    wrap_observation,
)

ALL_TAGS = (*ROLE_TAGS, *DEFAULT_TOOLS, "observation")


def kind_of(tag: str) -> str:
    if tag in ROLE_TAGS:
        return "role"
    if tag == "observation":
        return "observation"
    return "tool"


def assert_contiguous(traj, text: str) -> None:
    """Steps tile the input: each step's span is exactly its rendering."""
    pos = 0
    for s in traj.steps:
        assert s.start == pos, (s, pos)
        assert s.end >= s.start
        assert text[s.start : s.end] == s.render()
        pos = s.end
    assert pos == len(text)


# ============================================================================ strategies

# Content that can never form a tag: no "<" except in fragments that the tag regex rejects.
_safe_chars = st.characters(blacklist_characters="<", blacklist_categories=("Cs",))
_safe_fragments = st.sampled_from(["a < b", "<3", "<=", "<<", "x<-y", "< >", "<1a>", "->", "</", "/>"])
safe_content = st.lists(st.one_of(st.text(_safe_chars, max_size=12), _safe_fragments), max_size=4).map("".join)
# "</" followed by a name and ">" would be a tag; the fragments above never complete one
# because they are followed by content from the no-"<" alphabet or another fragment... except
# "</" + letters + ">" built across pieces. Guard against that explicitly:
safe_content = safe_content.filter(lambda s: not protocol._TAG_RE.search(s))

separator = st.text(st.sampled_from(" \n\t"), max_size=3)


@st.composite
def well_formed(draw):
    """(text, [(kind, tag, content), ...]) for a sequence of well-formed blocks."""
    n = draw(st.integers(0, 8))
    blocks, parts = [], [draw(separator)]
    for _ in range(n):
        tag = draw(st.sampled_from(ALL_TAGS))
        content = draw(safe_content)
        blocks.append((kind_of(tag), tag, content))
        parts.append(f"<{tag}>{content}</{tag}>")
        parts.append(draw(separator))
    return "".join(parts), blocks


def _tag_variants(tag: str, closing: bool):
    slash = "/" if closing else ""
    return st.sampled_from([
        f"<{slash}{tag}>",
        f"<{slash}{tag.upper()}>",
        f"<{slash}{tag.capitalize()}>",
        f"<{slash}{tag} >",
        f"<{slash} {tag}>",
        f"<{slash}{tag}\n>",
    ])


@st.composite
def messy_piece(draw):
    tag = draw(st.sampled_from((*ALL_TAGS, "foo", "verification", "tool_call", "Observation_x")))
    choice = draw(st.integers(0, 7))
    if choice == 0:  # a full (possibly odd-cased / spaced) block
        return draw(_tag_variants(tag, False)) + draw(safe_content) + draw(_tag_variants(tag, True))
    if choice == 1:  # an opening tag alone (unclosed / truncated)
        return draw(_tag_variants(tag, False))
    if choice == 2:  # a closing tag alone
        return draw(_tag_variants(tag, True))
    if choice == 3:  # stray text, possibly with odd characters
        return draw(st.text(max_size=10))
    if choice == 4:  # a truncated tag
        full = f"<{'/' if draw(st.booleans()) else ''}{tag}>"
        return full[: draw(st.integers(1, len(full) - 1))]
    if choice == 5:  # an observation as the environment writes it
        return wrap_observation(draw(safe_content))
    if choice == 6:  # nested
        inner = draw(st.sampled_from(ALL_TAGS))
        return f"<{tag}>x<{inner}>y</{inner}>z</{tag}>"
    return draw(separator)


messy_text = st.lists(messy_piece(), max_size=12).map("".join)


# ============================================================================ round trip


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_render_parse_roundtrip_arbitrary_text(text):
    traj = parse(text)
    assert render(traj) == text
    assert render(traj.steps) == text
    assert_contiguous(traj, text)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(messy_text)
def test_render_parse_roundtrip_messy_tags(text):
    traj = parse(text)
    assert render(traj) == text
    assert_contiguous(traj, text)
    # every step kind is known; text steps have no tag, blocks have a canonical tag
    for s in traj.steps:
        assert s.kind in ("role", "tool", "observation", "text")
        if s.kind == "text":
            assert s.tag == ""
        else:
            assert s.tag in ALL_TAGS
            assert s.open_raw is not None and s.open_raw.lower().replace(" ", "").replace("\n", "") == f"<{s.tag}>"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(messy_text, st.lists(st.sampled_from(["wiki_search", "my_tool", "CODE", "calc"]), max_size=3))
def test_roundtrip_with_custom_tool_lists(text, tools):
    traj = parse(text, tools)
    assert render(traj) == text


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(well_formed())
def test_well_formed_blocks_parse_exactly(sample):
    text, expected = sample
    traj = parse(text)
    assert traj.problems == []
    assert [(b.kind, b.tag, b.content) for b in traj.blocks] == expected
    assert all(b.closed for b in traj.blocks)
    assert render(traj) == text
    assert_contiguous(traj, text)
    # stray text between blocks is whitespace only
    assert all(not s.content.strip() for s in traj.steps if s.kind == "text")


@pytest.mark.parametrize("bad", [None, 42, 3.5, b"<think>x</think>", ["<think>x</think>"], {"a": 1}, object()])
def test_parse_never_raises_on_non_str(bad):
    traj = parse(bad)
    assert traj.steps == []
    assert len(traj.problems) == 1 and "not a string" in traj.problems[0]
    assert render(traj) == ""


# ============================================================================ tolerant cases


def _steps(text):
    return [(s.kind, s.tag, s.content, s.start, s.end) for s in parse(text).steps]


def test_truncated_block_at_end():
    traj = parse("<think>a")
    assert _steps("<think>a") == [("role", "think", "a", 0, 8)]
    assert not traj.steps[0].closed and traj.steps[0].close_raw == ""
    assert traj.problems == ["truncated <think> at 0"]


def test_unclosed_block_stops_at_next_known_opening_tag():
    text = "<think>a<plan>b</plan>"
    traj = parse(text)
    assert _steps(text) == [("role", "think", "a", 0, 8), ("role", "plan", "b", 8, 22)]
    assert not traj.steps[0].closed and traj.steps[1].closed
    assert traj.problems == ["unclosed <think> at 0"]


def test_unclosed_block_ignores_unknown_tags_inside():
    text = "<think>a<foo>b</foo><answer>c</answer>"
    traj = parse(text)
    assert [(b.tag, b.content) for b in traj.blocks] == [("think", "a<foo>b</foo>"), ("answer", "c")]
    assert "unclosed <think> at 0" in traj.problems


def test_nested_block_is_kept_inside_outer_and_reported():
    text = "<think>a<plan>b</plan>c</think>"
    traj = parse(text)
    assert _steps(text) == [("role", "think", "a<plan>b</plan>c", 0, 31)]
    assert traj.problems == ["<plan> nested inside <think> at 8"]


def test_stray_text_is_a_text_step_and_a_problem():
    text = "hi <think>a</think> there"
    traj = parse(text)
    assert _steps(text) == [("text", "", "hi ", 0, 3), ("role", "think", "a", 3, 19), ("text", "", " there", 19, 25)]
    assert traj.problems == ["stray text at 0: 'hi'", "stray text at 19: 'there'"]
    assert [b.tag for b in traj.blocks] == ["think"]


def test_whitespace_between_blocks_is_not_a_problem():
    traj = parse("\n<think>a</think>\n\n<answer>b</answer>\n")
    assert traj.problems == []
    assert [s.kind for s in traj.steps] == ["text", "role", "text", "role", "text"]


@pytest.mark.parametrize("open_raw,close_raw", [
    ("<THINK>", "</THINK>"), ("<Think>", "</think>"), ("<think >", "</think >"),
    ("< think>", "</ think>"), ("<think\n>", "</think\t>"),
])
def test_odd_case_and_whitespace_tags(open_raw, close_raw):
    text = f"{open_raw}x{close_raw}"
    traj = parse(text)
    assert [(b.kind, b.tag, b.content) for b in traj.blocks] == [("role", "think", "x")]
    assert traj.blocks[0].open_raw == open_raw and traj.blocks[0].close_raw == close_raw
    assert traj.problems == [f"non-canonical tag {open_raw!r} at 0"]
    assert render(traj) == text


def test_unknown_tags_become_text():
    text = "<foo>a</foo><think>b</think>"
    traj = parse(text)
    assert _steps(text) == [("text", "", "<foo>a</foo>", 0, 12), ("role", "think", "b", 12, 28)]
    assert "unknown tag '<foo>' at 0" in traj.problems
    assert "unknown tag '</foo>' at 6" in traj.problems


def test_verification_is_not_a_tag():
    # paper-facts: there is no <verification> tag.
    assert parse("<verification>x</verification>").blocks == []


def test_truncated_tag_text_is_stray():
    for text in ("<obs", "<think>a</thi", "<answer>x</answer><wiki_sea"):
        traj = parse(text)
        assert render(traj) == text
    assert parse("<think>a</thi").blocks[0].content == "a</thi"
    assert not parse("<think>a</thi").blocks[0].closed
    assert [b.tag for b in parse("<answer>x</answer><wiki_sea").blocks] == ["answer"]


def test_closing_without_opening():
    text = "</think><think>a</think>"
    traj = parse(text)
    assert _steps(text) == [("text", "", "</think>", 0, 8), ("role", "think", "a", 8, 24)]
    assert "closing tag '</think>' without opening at 0" in traj.problems


def test_mismatched_close_inside_block_is_content():
    traj = parse("<think>a</plan>b</think>")
    assert [(b.tag, b.content, b.closed) for b in traj.blocks] == [("think", "a</plan>b", True)]


def test_tool_tags_depend_on_tool_list():
    text = "<calc>1+1</calc>"
    assert parse(text).blocks == []
    traj = parse(text, tools=["CALC"])  # tool names are case-insensitive
    assert [(b.kind, b.tag, b.content) for b in traj.blocks] == [("tool", "calc", "1+1")]
    assert [b.kind for b in parse("<code>x</code>").blocks] == ["tool"]
    assert parse("<code>x</code>", tools=["wiki_search"]).blocks == []


def test_step_render_without_raw_tags_uses_canonical():
    s = protocol.Step("tool", "wiki_search", "q")
    assert s.render() == "<wiki_search>q</wiki_search>"
    assert protocol.Step("text", "", "abc").render() == "abc"
    assert protocol.block("answer", "4") == "<answer>4</answer>"


# ============================================================================ validate

MHQA_OK = (
    "<think>I need the capital.</think>\n"
    "<wiki_search>capital of France</wiki_search>\n"
    "<observation>Paris is the capital of France.</observation>\n"
    "<think>It is Paris.</think>\n"
    "<answer>Paris</answer>"
)
MHQA_OK_FULL = (
    "<plan>search then answer</plan>\n"
    "<think>search</think>\n"
    "<wiki_search>capital of France</wiki_search>\n"
    "<observation>Paris</observation>\n"
    "<reflection>information conflict: good</reflection>\n"
    "<think>done</think>\n"
    "<suggested_answer>Paris</suggested_answer>\n"
    "<double_check>score: 4</double_check>\n"
    "<answer>Paris</answer>"
)
MHQA_REPLAN = (
    "<think>t</think><suggested_answer>Lyon</suggested_answer><double_check>score 2</double_check>"
    "<plan>search</plan><wiki_search>capital of France</wiki_search><observation>Paris</observation>"
    "<think>t</think><answer>Paris</answer>"
)
MATH_OK = (
    "<plan>compute</plan>\n<think>use python</think>\n"
    "<code>\n```python\nprint(6*7)\n```\n</code>\n"
    "<observation>42</observation>\n"
    "<reflection>tool effectiveness: good</reflection>\n"
    "<think>so 42</think>\n<answer>\\boxed{42}</answer>"
)
MATH_CODE_FIRST = "<code>print(1)</code><observation>1</observation><think>t</think><answer>\\boxed{1}</answer>"
WEB_OK = (
    "<think>t</think>\n<plan>search, crawl</plan>\n"
    "<web_search>who wrote X</web_search>\n<observation>results</observation>\n"
    "<think>crawl</think>\n<crawl_page>https://a.org | https://b.org</crawl_page>\n"
    "<observation>page</observation>\n<think>t</think>\n"
    "<suggested_answer>Ann</suggested_answer>\n<double_check>3</double_check>\n<answer>Ann</answer>"
)


@pytest.mark.parametrize("profile,text", [
    ("mhqa", MHQA_OK), ("mhqa", MHQA_OK_FULL), ("mhqa", MHQA_REPLAN),
    ("math", MATH_OK), ("math", MATH_CODE_FIRST), ("code", MATH_OK),
    ("web", WEB_OK),
])
def test_valid_examples(profile, text):
    assert validate(text, profile) == []
    assert validate(parse(text), profile) == []


def test_non_canonical_tags_are_tolerated_by_validate():
    assert validate(MHQA_OK.replace("<think>", "<THINK>"), "mhqa") == []


def test_stray_text_is_a_violation():
    v = validate("hello " + MHQA_OK, "mhqa")
    assert len(v) == 1 and v[0].startswith("stray text")


def test_unknown_profile_raises():
    with pytest.raises(ValueError, match="unknown profile 'chess'"):
        validate(MHQA_OK, "chess")


# Hand-written transition tables ("T" = the profile's tool), independent of protocol.GRAMMAR.
EXPECTED = {
    "mhqa": {
        "<start>": {"think", "plan"},
        "plan": {"think", "T"},
        "think": {"T", "plan", "reflection", "suggested_answer", "answer"},
        "T": {"observation"},
        "observation": {"think", "reflection"},
        "reflection": {"think", "plan"},
        "suggested_answer": {"double_check"},
        "double_check": {"think", "plan", "answer"},
        "answer": set(),
    },
    "math": {
        "<start>": {"plan", "think", "T"},
        "plan": {"think"},
        "think": {"T", "answer", "reflection"},
        "T": {"observation"},
        "observation": {"reflection", "think"},
        "reflection": {"think", "plan"},
        "answer": set(),
    },
    "web": {
        "<start>": {"think"},
        "think": {"plan", "T", "reflection", "suggested_answer", "double_check", "answer"},
        "plan": {"T", "suggested_answer"},
        "T": {"observation"},
        "observation": {"think"},
        "reflection": {"think"},
        "suggested_answer": {"double_check"},
        "double_check": {"think", "plan", "answer"},
        "answer": set(),
    },
}
SYMBOLS = ("think", "plan", "reflection", "suggested_answer", "double_check", "answer", "T", "observation")
PROFILE_TOOL = {"mhqa": "wiki_search", "math": "code", "web": "web_search"}


def _render_symbols(profile: str, symbols) -> str:
    out = []
    for sym in symbols:
        if sym == "T":
            out.append(protocol.block(PROFILE_TOOL[profile], "query"))
        elif sym == "double_check":
            out.append(protocol.block(sym, "score 4"))
        else:
            out.append(protocol.block(sym, "x"))
    return "".join(out)


def _shortest_paths(table):
    paths = {"<start>": []}
    queue = deque(["<start>"])
    while queue:
        state = queue.popleft()
        for nxt in sorted(table.get(state, ())):
            if nxt not in paths:
                paths[nxt] = paths[state] + [nxt]
                queue.append(nxt)
    return paths


_PAIRS = [
    (profile, prev, nxt)
    for profile, table in EXPECTED.items()
    for prev in _shortest_paths(table)
    for nxt in SYMBOLS
]


@pytest.mark.parametrize("profile,prev,nxt", _PAIRS)
def test_grammar_transition(profile, prev, nxt):
    """Every (reachable state, next block) pair: an order violation iff the table forbids it."""
    path = _shortest_paths(EXPECTED[profile])[prev] + [nxt]
    text = _render_symbols(profile, path)
    n = len(path) - 1
    order = [v for v in validate(text, profile) if "may not follow" in v]
    if nxt in EXPECTED[profile][prev]:
        assert order == [], (text, order)
    else:
        shown = PROFILE_TOOL[profile] if nxt == "T" else nxt
        shown_prev = "tool" if prev == "T" else prev.strip("<>")  # a tool state is reported as <tool>
        assert order == [f"block {n}: <{shown}> may not follow <{shown_prev}>"], (text, order)


def test_every_state_reachable_in_expected_tables():
    # guards the parametrization above: it really exercises every state of each profile
    for profile, table in EXPECTED.items():
        assert set(_shortest_paths(table)) == set(table)


def test_code_profile_uses_math_grammar():
    assert protocol.GRAMMAR["code"] is protocol.GRAMMAR["math"]


@pytest.mark.parametrize("profile,text,tool", [
    ("mhqa", "<think>t</think><code>print(1)</code><observation>1</observation><think>t</think><answer>a</answer>", "code"),
    ("mhqa", "<think>t</think><web_search>q</web_search><observation>o</observation><think>t</think><answer>a</answer>", "web_search"),
    ("math", "<think>t</think><wiki_search>q</wiki_search><observation>o</observation><think>t</think><answer>a</answer>", "wiki_search"),
    ("web", "<think>t</think><wiki_search>q</wiki_search><observation>o</observation><think>t</think><answer>a</answer>", "wiki_search"),
    ("web", "<think>t</think><code>q</code><observation>o</observation><think>t</think><answer>a</answer>", "code"),
])
def test_tool_not_available_to_profile(profile, text, tool):
    assert validate(text, profile) == [f"block 1: tool <{tool}> not available to the {profile} agent"]


def test_custom_tool_list_overrides_profile_tools():
    text = "<think>t</think><web_search>q</web_search><observation>o</observation><think>t</think><answer>a</answer>"
    assert validate(text, "mhqa", tools=["wiki_search", "web_search"]) == []
    assert validate(text, "mhqa", tools=["wiki_search"]) == ["block 1: tool <web_search> not available to the mhqa agent"]


def test_custom_tool_name_is_parsed_when_listed():
    text = "<think>t</think><calc>1+1</calc><observation>2</observation><think>t</think><answer>2</answer>"
    assert validate(text, "mhqa", tools=["calc"]) == []


@pytest.mark.parametrize("call", ["", "   ", "\n\t"])
def test_empty_tool_call(call):
    text = MHQA_OK.replace("capital of France", call)
    assert validate(text, "mhqa") == ["block 1: empty <wiki_search> call"]


def test_double_check_high_score_then_plan():
    text = (
        "<think>t</think><suggested_answer>Paris</suggested_answer><double_check>3</double_check>"
        "<plan>p</plan><wiki_search>q</wiki_search><observation>o</observation><think>t</think><answer>Paris</answer>"
    )
    assert validate(text, "mhqa") == ["block 3: double_check scored 3 but re-planned"]


def test_double_check_low_score_then_answer():
    text = "<think>t</think><suggested_answer>Paris</suggested_answer><double_check>score: 2</double_check><answer>Paris</answer>"
    assert validate(text, "mhqa") == ["block 3: double_check scored 2 but answered"]
    assert validate(text.replace("score: 2", "1 of 4"), "web") == ["block 3: double_check scored 1 but answered"]


@pytest.mark.parametrize("content", ["looks right", "score 5", "10/10", ""])
def test_double_check_without_score(content):
    text = f"<think>t</think><suggested_answer>P</suggested_answer><double_check>{content}</double_check><answer>P</answer>"
    assert validate(text, "web") == ["block 2: double_check without a 1-4 score"]


def test_double_check_score_rules_web():
    base = "<think>t</think><suggested_answer>P</suggested_answer><double_check>{}</double_check>"
    assert validate(base.format("4") + "<answer>P</answer>", "web") == []
    assert validate(base.format("2") + "<plan>p</plan><web_search>q</web_search><observation>o</observation>"
                    "<think>t</think><answer>P</answer>", "web") == []


def test_missing_answer():
    text = "<think>t</think><wiki_search>q</wiki_search><observation>o</observation><think>t</think>"
    assert validate(text, "mhqa") == ["no <answer> block"]


def test_truncated_answer_is_reported():
    v = validate("<think>t</think><answer>Par", "mhqa")
    assert "truncated <answer> at 16" in v


def test_two_answers():
    text = "<think>t</think><answer>a</answer><answer>b</answer>"
    assert validate(text, "mhqa") == ["block 2: <answer> may not follow <answer>", "2 <answer> blocks"]


def test_answer_not_last():
    text = "<think>t</think><answer>a</answer><think>more</think>"
    assert validate(text, "mhqa") == ["block 2: <think> may not follow <answer>", "<answer> is not the last block"]


def test_order_violation_examples():
    assert validate("<answer>a</answer>", "mhqa") == ["block 0: <answer> may not follow <start>"]
    # web: think must come first, and plan may only be followed by a tool or suggested_answer
    assert validate("<plan>p</plan><think>t</think><answer>a</answer>", "web") == [
        "block 0: <plan> may not follow <start>", "block 1: <think> may not follow <plan>"]
    # math: after plan only think
    assert validate("<plan>p</plan><code>c</code><observation>o</observation><think>t</think><answer>1</answer>",
                    "math") == ["block 1: <code> may not follow <plan>"]
    # tool must be followed by its observation
    assert validate("<think>t</think><wiki_search>q</wiki_search><think>t</think><answer>a</answer>", "mhqa") == [
        "block 2: <think> may not follow <tool>"]


def test_nested_block_is_a_violation():
    text = "<think>a<plan>b</plan></think><answer>x</answer>"
    assert validate(text, "mhqa") == ["<plan> nested inside <think> at 8"]


# ============================================================================ helpers


def test_stop_strings():
    assert stop_strings(["wiki_search"]) == ["</wiki_search>", "</answer>"]
    assert stop_strings(DEFAULT_TOOLS) == ["</code>", "</wiki_search>", "</web_search>", "</crawl_page>", "</answer>"]
    assert stop_strings([]) == ["</answer>"]


def test_wrap_observation():
    w = wrap_observation("  result text \n")
    assert w == "\n<observation>\nresult text\n</observation>\n"
    traj = parse("<wiki_search>q</wiki_search>" + w)
    obs = [b for b in traj.blocks if b.kind == "observation"]
    assert len(obs) == 1 and obs[0].content.strip() == "result text"
    assert traj.problems == []


def test_observation_spans_cover_exactly_the_observation_blocks():
    text = (
        "<think>t</think><wiki_search>q1</wiki_search>" + wrap_observation("first")
        + "<think>t</think><wiki_search>q2</wiki_search>" + wrap_observation("second <b>bold</b>")
        + "<answer>a</answer>"
    )
    spans = observation_spans(text)
    assert [text[s:e] for s, e in spans] == [
        "<observation>\nfirst\n</observation>",
        "<observation>\nsecond <b>bold</b>\n</observation>",
    ]
    # outside the spans there is no observation text
    outside = "".join(text[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(text)]))
    assert "first" not in outside and "second" not in outside and "observation" not in outside
    assert observation_spans("<think>x</think>") == []
    assert observation_spans("") == []


def test_observation_spans_include_truncated_observation():
    text = "<code>x</code><observation>partial out"
    assert observation_spans(text) == [(14, len(text))]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(well_formed())
def test_observation_spans_property(sample):
    text, blocks = sample
    spans = observation_spans(text)
    assert [text[s:e] for s, e in spans] == [f"<observation>{c}</observation>" for k, t, c in blocks if t == "observation"]


def test_pending_tool_call_closed_tool_at_end():
    step = pending_tool_call("<think>t</think><wiki_search>capital</wiki_search>")
    assert step is not None and step.tag == "wiki_search" and step.content == "capital" and step.closed
    step = pending_tool_call("<think>t</think>\n<code>\nprint(1)\n</code>\n")
    assert step is not None and step.tag == "code"


def test_pending_tool_call_none_cases():
    assert pending_tool_call("<wiki_search>q</wiki_search>" + wrap_observation("o")) is None
    assert pending_tool_call("<think>t</think><wiki_search>capit") is None  # unclosed
    assert pending_tool_call("<think>t</think>") is None
    assert pending_tool_call("") is None
    assert pending_tool_call("<answer>a</answer>") is None


def test_pending_tool_call_custom_tools():
    assert pending_tool_call("<calc>1+1</calc>") is None
    step = pending_tool_call("<calc>1+1</calc>", tools=["calc"])
    assert step is not None and step.tag == "calc"


@pytest.mark.parametrize("text,expected", [
    ("<answer>Paris</answer>", "Paris"),
    ("<answer>  Paris \n</answer>", "Paris"),
    ("<answer>\\boxed{42}</answer>", "42"),
    ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}"),
    ("<answer>x = \\boxed{\\sqrt{\\frac{a}{b}}} done</answer>", "\\sqrt{\\frac{a}{b}}"),
    ("<answer>\\boxed{1} or \\boxed{2}</answer>", "2"),
    ("<answer>Paris|Lyon</answer>", "Paris|Lyon"),
    ("<answer>a | b</answer>", "a | b"),
    ("<answer>first</answer><think>t</think><answer>second</answer>", "second"),
    ("<answer>first</answer><answer>secon", "first"),
    ("<answer>unclosed", None),
    ("<think>no answer</think>", None),
    ("", None),
    ("<ANSWER>odd</ANSWER>", "odd"),
])
def test_final_answer(text, expected):
    assert final_answer(text) == expected


def test_final_answer_unbalanced_boxed_returns_content():
    assert final_answer("<answer>\\boxed{12</answer>") == "\\boxed{12"


# ============================================================================ written observations


def test_written_observations_counts_only_blocks_not_after_a_tool_call():
    env = "<think>x</think><wiki_search>a</wiki_search>" + protocol.wrap_observation("B") + "<answer>B</answer>"
    assert protocol.written_observations(env) == 0
    assert protocol.written_observations("<think>x</think><observation>made up</observation><answer>B</answer>") == 1
    # a second observation after the environment's one was written by the model
    assert protocol.written_observations(env.replace("<answer>", "<observation>again</observation><answer>")) == 1
    # an unclosed call gets no observation from the environment
    assert protocol.written_observations("<code>print(1)<observation>\n1\n</observation>") == 1
    assert protocol.written_observations("") == 0


@given(st.lists(st.tuples(st.sampled_from(["wiki_search", "code"]), st.text(alphabet="abc 123", max_size=12),
                          st.text(alphabet="xyz 789\n", max_size=20)), max_size=4))
def test_written_observations_is_zero_for_what_the_environment_builds(calls):
    # the rollout loop's own shape: each closed call followed by the observation it appends
    text = "<think>plan</think>" + "".join(f"<{t}>{a}</{t}>" + protocol.wrap_observation(o) for t, a, o in calls)
    assert protocol.written_observations(text + "<answer>done</answer>") == 0
    assert protocol.written_observations(text + "<observation>fake</observation>") == 1
