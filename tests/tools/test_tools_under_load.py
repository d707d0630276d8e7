"""Tools under load and under attack from the policy's own output.

- 32 concurrent sandbox executions and 32 concurrent searches: every result is the right
  one, whole, and not mixed with another call's output.
- A tool that hangs or crashes never stalls a rollout batch beyond `gen.tool_timeout_s`.
- Malformed model output (unclosed tags, a tool tag inside a think block, unknown tools, 1 MB
  of arguments, binary junk) goes through `run_coa` without an exception: the rollout ends or
  goes on with an observation, and its token mask stays exact.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coa_lab import protocol
from coa_lab.student_rollout import run_coa
from coa_lab.config import GenerationConfig
from coa_lab.generation.models import load_tokenizer
from coa_lab.generation.result import Generation
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import FunctionTool, ToolRegistry, build_tools
from coa_lab.tools.sandbox import sandbox_available

pytestmark = pytest.mark.model
needs_sandbox = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap missing")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


@pytest.fixture(scope="module")
def tools():
    return build_tools(["code", "wiki_search"])


@needs_sandbox
def test_32_concurrent_sandbox_runs_return_their_own_whole_output(tools):
    code = tools.get("code")
    # each program prints its own marker on many lines, slowly: interleaving would show
    programs = {n: f"```python\nimport time\nfor k in range(40):\n    print('run{n}-' + str(k))\n"
                   f"    if k % 10 == 0: time.sleep(0.01)\n```" for n in range(32)}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = dict(zip(programs, pool.map(code, programs.values())))
    elapsed = time.perf_counter() - t0
    for n, obs in results.items():
        assert obs.ok, obs.text
        assert obs.text.strip().splitlines() == [f"run{n}-{k}" for k in range(40)]
    assert elapsed < 120, f"32 sandbox runs took {elapsed:.0f} s"


def test_32_concurrent_searches_equal_the_sequential_ones(tools):
    search = tools.get("wiki_search")
    queries = [f"{name} director" for name in ("Ed Wood", "Scott Derrickson", "Doctor Strange", "Sinister",
                                               "The Exorcism of Emily Rose", "Hellraiser", "Deliver Us from Evil",
                                               "Citizen Kane")] * 4
    sequential = [search(q).text for q in queries]
    with ThreadPoolExecutor(max_workers=32) as pool:
        concurrent = [o.text for o in pool.map(search, queries)]
    assert concurrent == sequential and all(concurrent)


class PerRow:
    """A scripted policy whose output depends on the rollout (its prompt): row r writes
    `turns(r, turn)`; rows are told apart by the task id in the prompt."""

    def __init__(self, tokenizer, tasks, turns):
        self.tok = self.tokenizer = tokenizer  # run_coa reads .tokenizer
        self.turns = turns
        self.index = {t.question: n for n, t in enumerate(tasks)}
        self.turn: dict[int, int] = {}

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            n = next(n for q, n in self.index.items() if q in text)
            k = self.turn.get(n, 0)
            self.turn[n] = k + 1
            ids = self.tok(self.turns(n, k), add_special_tokens=False)["input_ids"][:max_new_tokens]
            out.append(Generation(list(ids), self.tok.decode(ids), "stop", len(p)))
        return out


@needs_sandbox
def test_a_batch_of_32_rollouts_gets_each_its_own_observation(tok, tools):
    tasks = [Task(f"t{n}", f"What is {n} times 1000 plus {n}?", [str(n * 1001)], "test", "math", {}) for n in range(32)]
    policy = PerRow(tok, tasks, lambda n, k: f"<code>print({n} * 1000 + {n})</code>" if k == 0
                    else f"<answer>\\boxed{{{n * 1001}}}</answer>")
    rollouts = run_coa(policy, tasks, tools, GenerationConfig(batch_size=32, max_new_tokens=40))
    for n, r in enumerate(rollouts):
        assert r.finish == "answer" and r.tool_calls == 1 and r.tool_errors == 0
        assert f"<observation>\n{n * 1001}\n</observation>" in r.text, r.text


def test_a_hung_tool_costs_a_batch_no_more_than_its_timeout(tok):
    def hang(arg):
        time.sleep(3600)

    tools = ToolRegistry([FunctionTool("wiki_search", "never answers", hang),
                          FunctionTool("code", "answers at once", lambda arg: "ok")])
    tasks = [Task(f"h{n}", f"Question number {n}?", ["x"], "test", "mhqa", {}) for n in range(4)]
    policy = PerRow(tok, tasks, lambda n, k: ("<wiki_search>anything</wiki_search>" if n % 2 else "<code>1</code>")
                    if k == 0 else "<answer>x</answer>")
    cfg = GenerationConfig(max_new_tokens=30, tool_timeout_s=1.0)
    t0 = time.perf_counter()
    rollouts = run_coa(policy, tasks, tools, cfg)
    assert time.perf_counter() - t0 < 30
    for n, r in enumerate(rollouts):
        assert r.finish == "answer"  # the rollout went on after the observation
        if n % 2:
            assert r.tool_errors == 1 and "timed out" in r.text
        else:
            assert r.tool_errors == 0 and "<observation>\nok\n</observation>" in r.text


def test_a_crashing_tool_is_an_observation_even_for_base_exceptions(tok):
    def die(arg):
        raise SystemExit(3)

    tools = ToolRegistry([FunctionTool("code", "exits", die)])
    task = Task("c", "Compute it?", ["1"], "test", "math", {})
    [r] = run_coa(PerRow(tok, [task], lambda n, k: "<code>x</code>" if k == 0 else "<answer>\\boxed{1}</answer>"),
                  [task], tools, GenerationConfig(max_new_tokens=30))
    assert r.finish == "answer" and r.tool_errors == 1 and "SystemExit" in r.text


# --------------------------------------------------------------- malformed model output

TAGS = ["think", "plan", "reflection", "answer", "code", "wiki_search", "observation", "calculator", "Code", "CODE"]
PIECES = st.one_of(
    st.sampled_from([f"<{t}>" for t in TAGS] + [f"</{t}>" for t in TAGS] + ["< code >", "</ wiki_search>", "<>", "</>"]),
    st.text(max_size=30),
    st.binary(max_size=30).map(lambda b: b.decode("latin-1")),  # binary junk as text
    st.sampled_from(["<think><code>print(1)</code></think>", "<calculator>2+2</calculator>",
                     "<code>import os; os.system('ls /')</code>", "<answer>\\boxed{", "\x00\x01\x02",
                     "<wiki_search>" + "a" * 2000 + "</wiki_search>"]),
)
# a turn ends where a model's generation stops: often at a tool call's closing tag
CALL_ENDINGS = st.sampled_from(["", "<code>print(2 + 2)</code>", "<think>hm <code>print(1)</code>",
                                "<wiki_search>Scott Derrickson</wiki_search>", "<code>" + "x = 1\n" * 3000 + "</code>",
                                "<code>\x00\xff</code>", "<wiki_search></wiki_search>",
                                "<calculator>2+2</calculator>", "<answer>\\boxed{4}</answer>"])
TURNS = st.lists(st.tuples(st.lists(PIECES, max_size=6).map("".join), CALL_ENDINGS).map("".join), min_size=1, max_size=4)


class Replay:
    """Every row writes turns[k] at its k-th turn (and stops as a model at a stop string would)."""

    def __init__(self, tokenizer, turns):
        self.tok = self.tokenizer = tokenizer
        self.turns, self.k = turns, 0

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        text = self.turns[min(self.k, len(self.turns) - 1)]
        self.k += 1
        ids = self.tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
        return [Generation(list(ids), self.tok.decode(ids), "stop", len(p)) for p in prompts]


@needs_sandbox
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(TURNS)
def test_any_model_output_leaves_a_well_formed_rollout(tok, tools, turns):
    cfg = GenerationConfig(max_new_tokens=200, max_turns=3, max_response_tokens=400, tool_timeout_s=20)
    task = Task("f", "What is 2 + 2?", ["4"], "test", "math", {})
    rollouts = run_coa(Replay(tok, turns), [task, task], tools, cfg)
    for r in rollouts:
        assert r.finish in {"answer", "eos", "length", "turn_length", "no_action", "max_turns"}
        assert len(r.response_ids) == len(r.response_mask) <= cfg.max_response_tokens
        assert r.tool_calls <= cfg.max_turns and r.tool_errors <= r.tool_calls
        # every 0-run of the mask is an observation the environment wrote, never model text
        assert r.response_mask.count(0) == 0 or "<observation>" in r.text


def test_a_megabyte_of_arguments_is_cut_to_the_budget_and_answered(tok, tools):
    huge = "<wiki_search>" + "Scott Derrickson " * 60_000 + "</wiki_search>"  # ~1 MB
    task = Task("m", "Who is Scott Derrickson?", ["x"], "test", "mhqa", {})
    cfg = GenerationConfig(max_new_tokens=1_000_000, max_response_tokens=2048)
    [r] = run_coa(Replay(tok, [huge, "<answer>x</answer>"]), [task], tools, cfg)
    assert len(r.response_ids) <= cfg.max_response_tokens and r.truncated and r.finish == "length"


def test_an_unknown_tool_gets_an_error_observation_and_the_rollout_goes_on(tok, tools):
    task = Task("u", "What is 2 + 2?", ["4"], "test", "math", {})
    policy = Replay(tok, ["<think>use a calculator</think><calculator>2+2</calculator>", "<answer>\\boxed{4}</answer>"])
    [r] = run_coa(policy, [task], tools, GenerationConfig(max_new_tokens=60))
    assert r.finish == "answer" and r.tool_calls == 1 and r.tool_errors == 1
    assert "unknown tool 'calculator'; the tools are: code, wiki_search" in r.text
    assert protocol.unknown_tool_call("<think>a</think>") is None and protocol.unknown_tool_call("<code>1</code>") is None


@needs_sandbox
def test_a_tool_call_inside_an_unclosed_think_block_still_runs(tok, tools):
    task = Task("n", "What is 2 + 2?", ["4"], "test", "math", {})
    [r] = run_coa(Replay(tok, ["<think>let me compute <code>print(2 + 2)</code>", "<answer>\\boxed{4}</answer>"]),
                  [task], tools, GenerationConfig(max_new_tokens=60))
    assert r.finish == "answer" and "<observation>\n4\n</observation>" in r.text
