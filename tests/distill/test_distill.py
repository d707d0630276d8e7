"""coa_lab/distill/convert.py (teacher run -> CoA text) and coa_lab/distill/filters.py
(progressive filtering with a per-stage report)."""

from __future__ import annotations

import pytest

from coa_lab import protocol
from coa_lab.capture.teacher import Activation, TeacherRun
from coa_lab.distill.convert import run_to_coa
from coa_lab.distill.filters import STAGES, progressive_filter, reflection_credible
from coa_lab.tasks.records import Task
from coa_lab.trajectories import TrajectoryRecord

CODE = "```python\nprint(6 * 7)\n```"


def act(agent, output, **kw):
    return Activation(agent=agent, messages=[{"role": "user", "content": "x"}], output=output,
                      prompt_tokens=10, completion_tokens=5, **kw)


def math_run(**over) -> TeacherRun:
    acts = [
        act("planner", "Compute the product with python."),
        act("thinker", "I need 6 times 7."),
        act("coder", CODE, tool="code", tool_input=CODE, observation="42\n", tool_ok=True),
        act("reflector", "The result 42 looks right."),
        act("thinker", "So the answer is 42."),
        act("answerer", over.pop("answer", "42")),
    ]
    return TeacherRun("math-1", "What is 6*7?", "math", ["42"], acts, **over)


def mhqa_run() -> TeacherRun:
    acts = [
        act("planner", "Find the capital of France."),
        act("thinker", "Search for it."),
        act("searcher", "capital of France", tool="wiki_search", tool_input="capital of France",
            observation="Paris is the capital and largest city of France.", tool_ok=True),
        act("reflector", "Tool effectiveness: good."),
        act("thinker", "It is Paris."),
        act("answerer", "Paris"),
    ]
    return TeacherRun("mhqa-1", "What is the capital of France?", "mhqa", ["Paris"], acts)


# ============================================================================ convert


def test_math_run_converts_to_valid_coa():
    text = run_to_coa(math_run())
    traj = protocol.parse(text)
    assert traj.problems == []
    assert protocol.validate(text, "math") == []
    assert [b.tag for b in traj.blocks] == ["plan", "think", "code", "observation", "reflection", "think", "answer"]
    code = traj.blocks[2]
    assert code.content.strip() == CODE  # the fenced program survives intact
    obs = traj.blocks[3]
    assert obs.content.strip() == "42"
    assert "<answer>\\boxed{42}</answer>" in text
    assert protocol.final_answer(text) == "42"
    assert traj.blocks[0].content == "Compute the product with python."


def test_mhqa_run_converts_to_valid_coa():
    text = run_to_coa(mhqa_run())
    traj = protocol.parse(text)
    assert traj.problems == []
    assert protocol.validate(text, "mhqa") == []
    assert [b.tag for b in traj.blocks] == ["plan", "think", "wiki_search", "observation", "reflection", "think", "answer"]
    assert traj.blocks[2].content == "capital of France"
    (s, e), = protocol.observation_spans(text)
    assert "Paris is the capital and largest city of France." in text[s:e]
    assert "\\boxed" not in text
    assert protocol.final_answer(text) == "Paris"


def test_multi_answer_is_preserved():
    run = mhqa_run()
    run.activations[-1].output = "Paris | Lyon"
    assert protocol.final_answer(run_to_coa(run)) == "Paris | Lyon"


def test_role_output_with_tags_is_neutralised():
    run = mhqa_run()
    run.activations[0].output = "Plan: <think>search</think> then <answer>Paris</answer>"
    run.activations[3].output = "</reflection> fine <observation>fake</observation>"
    run.activations[-1].output = "<answer>Paris</answer>"
    text = run_to_coa(run)
    traj = protocol.parse(text)
    assert traj.problems == []
    assert protocol.validate(text, "mhqa") == []
    assert [b.tag for b in traj.blocks].count("answer") == 1
    assert len(protocol.observation_spans(text)) == 1
    assert "fake" not in "".join(text[s:e] for s, e in protocol.observation_spans(text))
    assert "<" not in traj.blocks[0].content and ">" not in traj.blocks[0].content
    assert protocol.final_answer(text) == "Paris"  # an echoed answer tag means the answer inside


def test_whitespace_in_role_output_is_collapsed():
    run = mhqa_run()
    # The orchestrator passes on a prose agent's first line (a small model keeps talking
    # after it has answered); inside it, runs of whitespace collapse to one space.
    run.activations[1].output = "\n  line   one  \n\n  line   two  "
    assert "<think>line one</think>" in run_to_coa(run)


def test_code_comparison_operators_are_not_mangled():
    code = "```python\nprint(3 < 4, 5 > 2)\n```"
    run = math_run()
    run.activations[2].tool_input = code
    text = run_to_coa(run)
    assert protocol.parse(text).blocks[2].content.strip() == code
    assert protocol.validate(text, "math") == []


def test_missing_observation_still_valid():
    run = mhqa_run()
    run.activations[2].observation = None
    text = run_to_coa(run)
    assert protocol.parse(text).problems == []
    assert len(protocol.observation_spans(text)) == 1


def test_tool_input_echoing_the_tool_tag_is_neutralised():
    run = mhqa_run()
    run.activations[2].tool_input = "<wiki_search>capital of France</wiki_search>"
    text = run_to_coa(run)
    assert protocol.parse(text).problems == []


def test_observation_with_coa_tags_does_not_break_structure():
    run = math_run()
    run.activations[2].observation = "printed </observation> and <answer>7</answer>\n"
    try:
        text = run_to_coa(run)
    except ValueError:  # refusing the run is also acceptable
        return
    traj = protocol.parse(text)
    assert traj.problems == []
    spans = protocol.observation_spans(text)
    assert "printed" in text[spans[0][0]:spans[0][1]] and "and" in text[spans[0][0]:spans[0][1]]


# ============================================================================ filters


TASKS = {
    "math-1": Task(id="math-1", question="What is 6*7?", answers=["42"], source="t", profile="math"),
    "mhqa-1": Task(id="mhqa-1", question="Capital of France?", answers=["Paris"], source="t", profile="mhqa"),
}


def count_tokens(text: str) -> int:
    return len(text.split())


def rec(id_, text, task_id="mhqa-1", profile="mhqa", source="teacher") -> TrajectoryRecord:
    task = TASKS[task_id]
    return TrajectoryRecord(id=id_, task_id=task_id, source=source, profile=profile, question=task.question,
                            answers=list(task.answers), text=text)


def search(q="capital of France", obs="Paris is the capital."):
    return f"<wiki_search>{q}</wiki_search>" + protocol.wrap_observation(obs)


GOOD = "<think>search</think>" + search() + "<think>It is Paris.</think><answer>Paris</answer>"
WRONG = GOOD.replace("<answer>Paris</answer>", "<answer>Lyon</answer>")
NO_TOOL = "<think>I know it.</think><answer>Paris</answer>"
FOUR_CALLS = "".join(f"<think>t{i}</think>" + search(f"q{i}") for i in range(4)) + "<think>t</think><answer>Paris</answer>"
BAD_ORDER = search() + "<think>t</think><answer>Paris</answer>"  # starts with a tool
REPEATED = "<think>a</think>" + search() + "<think>b</think>" + search() + "<think>c</think><answer>Paris</answer>"
LONG = "<think>" + "word " * 60 + "</think>" + search() + "<think>t</think><answer>Paris</answer>"
REFLECT_SAME = ("<think>a</think>" + search() + "<reflection>tool effectiveness: poor</reflection><think>retry</think>"
                + search() + "<think>c</think><answer>Paris</answer>")
REFLECT_CHANGED = ("<think>a</think>" + search("France capital?") + "<reflection>tool effectiveness: poor</reflection>"
                   "<think>retry</think>" + search() + "<think>c</think><answer>Paris</answer>")
MATH_GOOD = run_to_coa(math_run())


def test_fixtures_are_what_they_claim():
    # each bad record is bad in exactly the intended way
    assert protocol.validate(GOOD, "mhqa") == []
    assert protocol.validate(NO_TOOL, "mhqa") == []
    assert protocol.validate(FOUR_CALLS, "mhqa") == []
    assert protocol.validate(REPEATED, "mhqa") == []
    assert protocol.validate(LONG, "mhqa") == []
    assert protocol.validate(REFLECT_SAME, "mhqa") == []
    assert protocol.validate(REFLECT_CHANGED, "mhqa") == []
    assert protocol.validate(BAD_ORDER, "mhqa") != []
    assert count_tokens(LONG) > 40 >= max(count_tokens(t) for t in (GOOD, REPEATED, REFLECT_SAME, BAD_ORDER))


def _run(records, **kw):
    kw.setdefault("max_tool_calls", 3)
    kw.setdefault("max_tokens", 40)
    return progressive_filter(records, TASKS, count_tokens, **kw)


def _drop(report, id_):
    (d,) = [d for d in report.dropped if d["id"] == id_]
    return d["stage"], d["reason"]


def test_each_stage_drops_its_failures():
    records = [
        rec("good", GOOD),
        rec("wrong", WRONG),
        rec("notool", NO_TOOL),
        rec("fourcalls", FOUR_CALLS),
        rec("order", BAD_ORDER),
        rec("repeated", REPEATED),
        rec("long", LONG),
        rec("math", MATH_GOOD, task_id="math-1", profile="math"),
        rec("changed", REFLECT_CHANGED),
    ]
    kept, report = _run(records)
    assert [r.id for r in kept] == ["good", "math", "changed"]
    assert report.counts == {"teacher": {"input": 9, "correctness": 8, "complexity": 6, "quality": 3, "reflection": 3}}
    assert _drop(report, "wrong") == ("correctness", "wrong answer 'Lyon'")
    assert _drop(report, "notool") == ("complexity", "too few tool calls: 0, want 1..3")
    assert _drop(report, "fourcalls") == ("complexity", "too many tool calls: 4, want 1..3")
    stage, reason = _drop(report, "order")
    assert stage == "quality" and reason.startswith("format: block 0: <wiki_search> may not follow <start>")
    assert _drop(report, "repeated") == ("quality", "repeated identical tool call")
    assert _drop(report, "long")[0] == "quality" and _drop(report, "long")[1].endswith("tokens > 40")
    assert len(report.dropped) == 6
    assert {d["source"] for d in report.dropped} == {"teacher"}
    # every drop is counted under its stage's kind of reason, and nothing else is
    assert report.by_reason() == {
        "correctness": {"wrong answer": 1},
        "complexity": {"too few tool calls": 1, "too many tool calls": 1},
        "quality": {"format": 1, "repeated identical tool call": 1, "over the token budget": 1},
        "reflection": {"same tool call after a reflection": 0, "reflection misreports the tool": 0,
                       "answer ignores the correction": 0, "judge rejected": 0},
    }


def test_survivors_get_reward_and_counts():
    kept, _ = _run([rec("good", GOOD), rec("math", MATH_GOOD, task_id="math-1", profile="math")])
    good, math = kept
    assert good.reward == 1.0 and good.n_tool_calls == 1 and good.n_tokens == count_tokens(GOOD)
    assert math.reward == 1.0 and math.n_tool_calls == 1


def test_counts_are_per_source_and_table_renders():
    records = [rec("a", GOOD, source="teacher"), rec("b", WRONG, source="fireact"), rec("c", GOOD, source="fireact")]
    kept, report = _run(records)
    assert [r.id for r in kept] == ["a", "c"]
    assert report.counts["teacher"] == {"input": 1, "correctness": 1, "complexity": 1, "quality": 1, "reflection": 1}
    assert report.counts["fireact"] == {"input": 2, "correctness": 1, "complexity": 1, "quality": 1, "reflection": 1}
    table = report.table()
    assert "| fireact | 2 | 1 | 1 | 1 | 1 |" in table and "| teacher | 1 | 1 | 1 | 1 | 1 |" in table
    assert all(s in table.splitlines()[0] for s in STAGES)


def test_counts_never_increase_along_stages():
    records = [rec(str(i), t) for i, t in enumerate([GOOD, WRONG, NO_TOOL, REPEATED, LONG, BAD_ORDER, REFLECT_CHANGED])]
    _, report = _run(records)
    c = report.counts["teacher"]
    seq = [c["input"]] + [c[s] for s in STAGES]
    assert seq == sorted(seq, reverse=True)
    assert c["input"] - c["reflection"] == len(report.dropped)


def test_judge_rejection_is_a_reflection_drop():
    kept, report = _run([rec("good", GOOD), rec("changed", REFLECT_CHANGED)], judge=lambda r: r.id != "changed")
    assert [r.id for r in kept] == ["good"]
    assert _drop(report, "changed") == ("reflection", "judge rejected")
    assert report.counts["teacher"]["quality"] == 2 and report.counts["teacher"]["reflection"] == 1


def test_reflection_credible_rule():
    assert reflection_credible(protocol.parse(REFLECT_SAME)) == "same tool call after a reflection"
    assert reflection_credible(protocol.parse(REFLECT_CHANGED)) is None
    assert reflection_credible(protocol.parse(GOOD)) is None
    # a repeat WITHOUT a reflection in between is not this stage's concern
    assert reflection_credible(protocol.parse(REPEATED)) is None


def test_reflection_followed_by_same_call_is_dropped_at_reflection_stage():
    kept, report = _run([rec("same", REFLECT_SAME)])
    assert kept == []
    assert _drop(report, "same") == ("reflection", "same tool call after a reflection")


def test_reflection_followed_by_same_call_is_dropped():
    # whichever stage claims it, such a record never survives
    kept, report = _run([rec("same", REFLECT_SAME)])
    assert kept == [] and len(report.dropped) == 1


def test_judge_only_sees_records_that_reached_the_reflection_stage():
    seen = []

    def judge(r):
        seen.append(r.id)
        return True

    _run([rec("good", GOOD), rec("wrong", WRONG), rec("notool", NO_TOOL), rec("long", LONG)], judge=judge)
    assert seen == ["good"]


# What the 135M teacher writes when asked for a second hop it does not need (runs/…/capture,
# capture.multi_hop_tasks): the reflection after the second call repeats the first result, or
# the answer ignores what the second call returned.
def code(expr, out):
    return f"<code>\n```python\nprint({expr})\n```\n</code>" + protocol.wrap_observation(out)


TWO_HOP_Q = "The school orders 39 boxes of 45 pencils and 50 boxes of 23 pens. How many in all?"
MISREPORTED = ("<think>39 * 45 + 50 * 23</think>" + code("39 * 45 + 50 * 23", "2905")
               + "<reflection>The code ran and printed 2905.</reflection><think>2905 * 45 + 29</think>"
               + code("2905 * 45 + 29", "130754") + "<reflection>The code ran and printed 2905.</reflection>"
               "<think>The school orders 2905.</think><answer>\\boxed{2905}</answer>")
IGNORED = ("<think>39 * 45 + 50 * 23</think>" + code("39 * 45 + 50 * 23", "2905")
           + "<reflection>The code ran and printed 2905.</reflection><think>2905 * 45 + 29</think>"
           + code("2905 * 45 + 29", "130754") + "<reflection>The code ran and printed 130754.</reflection>"
           "<think>The school orders 2905.</think><answer>\\boxed{2905}</answer>")
# a genuine correction: the first call was wrong, the reflection says what it printed, the
# second call differs and the answer is what it returned
GENUINE = ("<think>39 * 45 + 50 * 23</think>" + code("39 * 45 + 50 + 23", "1828")
           + "<reflection>The code ran and printed 1828, but the pens were added, not multiplied.</reflection>"
           "<think>39 * 45 + 50 * 23</think>" + code("39 * 45 + 50 * 23", "2905")
           + "<reflection>The code ran and printed 2905.</reflection><think>2905.</think><answer>\\boxed{2905}</answer>")


def test_a_reflection_that_misreports_its_tool_is_not_credible():
    assert protocol.validate(MISREPORTED, "math") == []
    why = reflection_credible(protocol.parse(MISREPORTED), TWO_HOP_Q)
    assert why == "reflection misreports the tool: it says 2905, the observation does not"
    # numbers the question holds may be quoted: "45" and "23" are not inventions
    quoting = MISREPORTED.replace("printed 2905.</reflection><think>The school",
                                  "printed 130754 for 45 and 23.</reflection><think>The school")
    assert not (reflection_credible(protocol.parse(quoting), TWO_HOP_Q) or "").startswith("reflection misreports")
    assert reflection_credible(protocol.parse(quoting), "no numbers here").startswith("reflection misreports")


def test_an_answer_that_ignores_the_correction_is_not_credible():
    why = reflection_credible(protocol.parse(IGNORED), TWO_HOP_Q)
    assert why == "answer ignores the correction: '2905' is not in what the corrected call returned"
    assert reflection_credible(protocol.parse(GENUINE), TWO_HOP_Q) is None
    # whole words only: 290 is not "in" 2905
    assert reflection_credible(protocol.parse(GENUINE.replace("boxed{2905}", "boxed{290}")), TWO_HOP_Q).startswith(
        "answer ignores the correction")
    # one hop has no correction to ignore, whatever the answer
    one_hop = "<think>a</think>" + code("39 * 45", "1755") + "<reflection>It printed 1755.</reflection><answer>7</answer>"
    assert reflection_credible(protocol.parse(one_hop), TWO_HOP_Q) is None


def test_the_reflection_stage_counts_each_kind_of_fake_correction():
    tasks = {**TASKS, "pens": Task(id="pens", question=TWO_HOP_Q, answers=["2905"], source="t", profile="math")}
    records = [TrajectoryRecord(id=i, task_id="pens", source="teacher-2hop", profile="math", question=TWO_HOP_Q,
                                answers=["2905"], text=t)
               for i, t in [("mis", MISREPORTED), ("ign", IGNORED), ("gen", GENUINE)]]
    records.append(rec("same", REFLECT_SAME, source="teacher-2hop"))
    kept, report = progressive_filter(records, tasks, count_tokens, max_tool_calls=2, max_tokens=400)
    assert [r.id for r in kept] == ["gen"]
    assert report.counts["teacher-2hop"] == {"input": 4, "correctness": 4, "complexity": 4, "quality": 4, "reflection": 1}
    assert report.by_reason()["reflection"] == {"same tool call after a reflection": 1,
                                                "reflection misreports the tool": 1,
                                                "answer ignores the correction": 1, "judge rejected": 0}


@pytest.mark.model
def test_the_pipeline_imports_only_the_sources_asked_for(tmp_path):
    from coa_lab.config import get_preset
    from coa_lab.lessons.inputs import SHIPPED_TEACHER_RUNS, distill_teacher_runs

    for sources in (("tora",), ("fireact", "r1searcher")):
        preset = get_preset("cpu-smoke", distill={"imported_per_suite": 3, "imported_sources": sources})
        summary = distill_teacher_runs(preset, SHIPPED_TEACHER_RUNS, tmp_path / "-".join(sources))
        imported = {s: c["input"] for s, c in summary["by_source"].items() if not s.startswith("teacher")}
        assert imported == {s: 3 for s in sources}
