"""coa_lab/lessons/rl_group.py: notebook 04's update by hand reads its groups back from the RL run's
rollouts.jsonl; each record becomes the Rollout policy_update takes, with the prompt the student was
sampled with and the observation tokens masked."""

import pytest

from coa_lab import protocol
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.lessons.rl_group import read_groups
from coa_lab.prompts import task_messages
from coa_lab.trajectories import TrajectoryRecord, save_records

LOOKUP = ("<plan>Search.</plan>\n<wiki_search>Mr. Arkadin</wiki_search>\n"
          "<observation>(1) Mr. Arkadin: a 1955 film directed by Orson Welles.</observation>\n"
          "<think>The passage says Orson Welles.</think>\n<answer>Orson Welles</answer>")


def _record(n: int, task: str, text: str, step: int, shaped: float, truncated: bool = False) -> TrajectoryRecord:
    return TrajectoryRecord(id=f"rl-{step}-{n}", task_id=task, source="rl", profile="mhqa",
                            question="Who directed Mr. Arkadin?", answers=["Orson Welles"], text=text, reward=1.0,
                            n_tool_calls=1, metadata={"step": step, "shaped_reward": shaped, "finish": "answer",
                                                      "truncated": truncated})


@pytest.fixture(scope="module")
def tok():
    from coa_lab.config import ModelConfig
    from coa_lab.generation.models import load_tokenizer

    return load_tokenizer(ModelConfig().name)  # the embedded model's tokenizer (offline)


def test_groups_come_back_in_order_with_their_rewards_prompt_and_mask(tmp_path, tok):
    records = [_record(0, "a", LOOKUP, 0, 1.0), _record(1, "a", "<answer>Welles</answer>", 0, -0.25),
               _record(2, "b", LOOKUP, 0, 0.0), _record(3, "b", LOOKUP, 0, 0.0, truncated=True),
               _record(4, "a", LOOKUP, 1, 1.0), _record(5, "a", LOOKUP, 1, 0.0)]
    save_records(records, tmp_path / "rollouts.jsonl")
    groups = read_groups(tmp_path / "rollouts.jsonl", tok, ["wiki_search"], group_size=2)
    assert [[x.task.id for x in g] for g, _ in groups] == [["a", "a"], ["b", "b"], ["a", "a"]]
    assert [s for _, s in groups] == [[1.0, -0.25], [0.0, 0.0], [1.0, 0.0]]  # the shaped rewards
    first = groups[0][0][0]
    assert first.prompt_ids == chat_prompt_ids(tok, task_messages("mhqa", "Who directed Mr. Arkadin?", ["wiki_search"]))
    assert tok.decode(first.response_ids) == LOOKUP and len(first.response_mask) == len(first.response_ids)
    masked = tok.decode([t for t, m in zip(first.response_ids, first.response_mask) if m == 0])
    (s, e), = protocol.observation_spans(LOOKUP)
    assert LOOKUP[s:e] in masked and "<think>" not in masked and "Orson Welles</answer>" not in masked
    assert not first.response_logprobs  # the file keeps none: no TIS weight applies
    assert groups[1][0][1].truncated and not groups[1][0][0].truncated


def test_a_step_that_is_not_whole_groups_is_refused(tmp_path, tok):
    save_records([_record(0, "a", LOOKUP, 0, 1.0), _record(1, "b", LOOKUP, 0, 0.0)], tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match="not one task's group"):
        read_groups(tmp_path / "r.jsonl", tok, ["wiki_search"], group_size=2)
    with pytest.raises(ValueError, match="not whole groups"):
        read_groups(tmp_path / "r.jsonl", tok, ["wiki_search"], group_size=3)
