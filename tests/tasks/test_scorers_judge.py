"""llm_judge: one-word verdicts parsed robustly through any chat backend (faked here)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coa_lab.tasks.judge import JUDGE_STATS, judge_messages, llm_judge, parse_verdict


@dataclass
class _Gen:
    text: str


class FakeBackend:
    """Implements the chat interface of HFGenerator / OpenAIChatBackend with canned replies."""

    def __init__(self, reply: str) -> None:
        self.reply, self.seen = reply, []

    def chat(self, conversations, max_new_tokens, temperature=0.0):
        self.seen.append((conversations, max_new_tokens, temperature))
        return [_Gen(self.reply) for _ in conversations]


@pytest.mark.parametrize("reply, verdict", [
    ("yes", True), ("Yes.", True), ("**YES**", True), ("Correct", True), ("true", True),
    ("no", False), ("No, the dates differ.", False), ("Incorrect.", False), ("not correct", False),
    ("<think>the gold says 2022, the answer 2022</think>\nyes", True),
    ("Verdict: no", False), ("Answer: yes", True),
    ("", None), ("maybe", None), ("I cannot tell.", None), ("The candidate is right.", None),
])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_llm_judge_scores_and_counts():
    JUDGE_STATS.clear()
    yes, no, odd = FakeBackend("Yes"), FakeBackend("no"), FakeBackend("It depends on the source.")
    assert llm_judge("When?", "1 Sep 2022", "September 1st, 2022", yes) == 1.0
    assert llm_judge("When?", ["1 Sep 2022"], "2021", no) == 0.0
    assert llm_judge("When?", "1 Sep 2022", "2022", odd) == 0.0
    assert llm_judge("When?", "1 Sep 2022", "  ", yes) == 0.0  # empty answer: no model call
    assert (JUDGE_STATS["yes"], JUDGE_STATS["no"], JUDGE_STATS["unparsed"]) == (1, 1, 1)
    conversations, max_new_tokens, temperature = yes.seen[0]
    assert temperature == 0.0 and max_new_tokens > 0 and len(conversations) == 1


def test_judge_prompt_shows_question_golds_and_answer():
    messages = judge_messages("Who wrote it?", ["Mark Twain", "Samuel Clemens"], "Twain")
    user = messages[-1]["content"]
    assert messages[0]["role"] == "system" and "one word" in messages[0]["content"].lower()
    assert "Who wrote it?" in user and "- Mark Twain" in user and "- Samuel Clemens" in user and "Twain" in user
