"""The multi-agent teacher records every activation, and runs real tools between agents."""

import pytest

from coa_lab import protocol
from coa_lab.capture.teacher import TeacherRun, extract_tool_input, load_runs, run_teacher, save_runs
from coa_lab.config import CaptureConfig
from coa_lab.distill.convert import run_to_coa
from coa_lab.generation.result import Generation
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools


class ScriptedAgents:
    """Answers each agent by its system prompt, like a deterministic teacher model."""

    def __init__(self):
        self.conversations = []

    def chat(self, conversations, max_new_tokens, temperature=0.0):
        out = []
        for msgs in conversations:
            self.conversations.append(msgs)
            system = msgs[0]["content"]
            if "planner" in system:
                text = "1. compute 6*7"
            elif "code agent" in system:
                text = "Here:\n```python\nprint(6 * 7)\n```"
            elif "reflector" in system:
                text = "The result 42 answers the question."
            elif "answer agent" in system:
                text = "42"
            else:
                text = "Multiply the numbers."
            out.append(Generation([], text, "eos", prompt_tokens=len(str(msgs)) // 4, completion_tokens=len(text) // 4))
        return out


def test_teacher_records_every_activation_and_runs_tools(tmp_path):
    task = Task("m1", "What is 6 times 7?", ["42"], "test", "math", {})
    backend = ScriptedAgents()
    [run] = run_teacher(backend, [task], build_tools(["code", "wiki_search"]), CaptureConfig(max_hops=2))
    agents = [a.agent for a in run.activations]
    assert agents == ["planner", "thinker", "coder", "reflector", "thinker", "coder", "reflector", "thinker", "answerer"]
    coder = run.activations[2]
    assert coder.tool == "code" and coder.observation.strip() == "42" and coder.tool_ok
    # each agent has its own context: the coder never sees the planner's system prompt
    assert all(c[0]["content"] != backend.conversations[0][0]["content"] for c in backend.conversations[1:])
    assert run.final_answer == "42" and run.tool_calls == 2 and run.tokens > 0
    save_runs([run], tmp_path / "t.jsonl")
    [back] = load_runs(tmp_path / "t.jsonl")
    assert back == run
    coa = run_to_coa(run)
    assert protocol.validate(coa, "math") == [] and protocol.final_answer(coa) == "42"


def test_extract_tool_input():
    assert extract_tool_input("math", "x\n```python\nprint(1)\n```\ny") == "```python\nprint(1)\n```"
    assert extract_tool_input("math", "print(2)") == "```python\nprint(2)\n```"
    assert extract_tool_input("mhqa", '\n"Query: Eiffel tower height"\nmore') == "Eiffel tower height"


def test_load_runs_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"task_id": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        load_runs(p)
    assert isinstance(TeacherRun("a", "q", "math", ["1"]).tokens, int)
