"""The single-model CoA runner: generate -> stop at a tool tag -> run the tool -> inject the
observation -> continue, batched over many trajectories, tools run concurrently.

Evaluation and RL use this same function; RL additionally keeps, per response token,
whether the policy wrote it (mask 1) or the environment did (mask 0: observations).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from coa_lab import distributed, protocol, throughput
from coa_lab.config import GenerationConfig
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.progress import progress_bar
from coa_lab.prompts import task_messages
from coa_lab.tools.base import Observation, error_observation

ALREADY_SEARCHED = "You already made this exact call; its result is above. Try something different."


@dataclass
class Rollout:
    task: object  # coa_lab.tasks.Task
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = policy token, 0 = observation token
    # per response token: the sampler's log-prob of a policy token (0.0 on observation tokens),
    # and per policy token the entropy it was sampled from; empty when the backend reports none
    response_logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    text: str = ""  # the response, decoded piece by piece exactly as the model saw it
    tool_calls: int = 0
    tool_errors: int = 0
    # answer | eos | no_action | max_turns | turn_length (one turn hit gen.max_new_tokens: a
    # loop, a failure the gradient must see) | length (the whole response budget ran out)
    finish: str = "running"
    truncated: bool = False  # hit the RESPONSE budget only: what DAPO's overlong filtering may mask

    @property
    def done(self) -> bool:
        return self.finish != "running"

    @property
    def policy_tokens(self) -> int:
        return sum(self.response_mask)


def run_coa(generator, tasks: list, tools, cfg: GenerationConfig, samples: int | list[int] = 1,
            temperature: float | list[float] = 0.0, progress: str | None = None) -> list[Rollout]:
    """Roll out `samples` CoA trajectories per task. Returns them grouped: task0 x samples, ...

    temperature: each stage passes its own (eval.temperature, rl.temperature); 0 is greedy.
    samples, temperature: one for every task, or a list with one per task (evaluation reads its
    greedy and sampled readouts in one pass: evaluate.evaluate_readouts).

    tools: a ToolRegistry; each task's profile decides which of its tools are announced.
    progress: a label for a tqdm bar over finished rollouts (None: no bar).
    """
    tok = generator.tokenizer
    per_task = lambda x: list(x) if isinstance(x, (list, tuple)) else [x] * len(tasks)  # noqa: E731
    samples, temperature = per_task(samples), per_task(temperature)
    if not len(samples) == len(temperature) == len(tasks):
        raise ValueError(f"{len(samples)} sample counts and {len(temperature)} temperatures for {len(tasks)} tasks")
    rollouts: list[Rollout] = []
    row_temperature: list[float] = []
    for task, k, t in zip(tasks, samples, temperature):
        names = [n for n in protocol.PROFILE_TOOLS[task.profile] if n in tools]
        prompt = chat_prompt_ids(tok, task_messages(task.profile, task.question, names))
        rollouts.extend(Rollout(task, list(prompt)) for _ in range(k))
        row_temperature += [t] * k
    stops = protocol.stop_strings(tools.names())
    bar = progress_bar(total=len(rollouts), desc=progress, unit="rollout", leave=False, disable=progress is None)
    env = _CoaTurns(rollouts, tools, cfg, tok, bar)
    if hasattr(generator, "multi_turn"):
        # one pass that keeps each row's KV cache across tool turns (coa_lab.generation.decoding)
        same = len(set(row_temperature)) <= 1
        generator.multi_turn([r.prompt_ids for r in rollouts], env.turns_ended, max_new_tokens=cfg.max_new_tokens,
                             max_response_tokens=cfg.max_response_tokens,
                             temperature=row_temperature[0] if same and rollouts else row_temperature,
                             top_p=cfg.top_p, stop=stops)
    else:
        _one_turn_at_a_time(generator, rollouts, row_temperature, env, cfg, stops)
    for r in rollouts:
        if not r.done:
            r.finish = "max_turns"
    bar.update(len(rollouts) - bar.n)
    bar.close()
    throughput.count(len(rollouts), sum(r.policy_tokens for r in rollouts))  # the stage's rollouts/s and tokens/s
    return rollouts


def _one_turn_at_a_time(generator, rollouts, row_temperature, env, cfg: GenerationConfig, stops) -> None:
    """Backends that only serve one turn (vLLM, scripted test policies): each turn re-sends the
    prefix, one request per temperature among the rows still going."""
    for _turn in range(cfg.max_turns):
        active = [i for i, r in enumerate(rollouts) if not r.done]
        if not active:
            break
        for t in sorted({row_temperature[i] for i in active}):
            rows = [i for i in active if row_temperature[i] == t]
            prompts = [rollouts[i].prompt_ids + rollouts[i].response_ids for i in rows]
            budget = [cfg.max_response_tokens - len(rollouts[i].response_ids) for i in rows]
            gens = generator.generate(prompts, max(1, min(cfg.max_new_tokens, max(budget))), t, cfg.top_p, stops)
            env.turns_ended(list(zip(rows, gens)))


class _CoaTurns:
    """The environment side of a rollout: record a finished turn, decide how the rollout
    goes on, run the tools it called (concurrently) and hand back the observation ids."""

    def __init__(self, rollouts: list[Rollout], tools, cfg: GenerationConfig, tokenizer, bar=None):
        self.rollouts, self.tools, self.cfg, self.tok, self.bar = rollouts, tools, cfg, tokenizer, bar
        self.turns = [0] * len(rollouts)
        self.seen_calls: list[set[str]] = [set() for _ in rollouts]

    def turns_ended(self, events) -> list[list[int] | None]:
        cfg, tok, tools = self.cfg, self.tok, self.tools
        replies: dict[int, list[int] | None] = {}
        pending: list[tuple[int, protocol.Step]] = []
        for i, gen in events:
            r = self.rollouts[i]
            self.turns[i] += 1
            replies[i] = None
            room = cfg.max_response_tokens - len(r.response_ids)
            ids = gen.token_ids[: max(room, 0)]
            r.response_ids += ids
            r.response_mask += [1] * len(ids)
            if gen.logprobs is not None:
                r.response_logprobs += list(gen.logprobs[: len(ids)])
            if gen.entropies is not None:  # vLLM reports log-probs but no entropies
                r.entropies += list(gen.entropies[: len(ids)])
            r.text += tok.decode(ids, skip_special_tokens=False)
            if len(r.response_ids) >= cfg.max_response_tokens:
                r.finish, r.truncated = "length", True
                continue
            call = protocol.pending_tool_call(r.text, tools.names())
            unknown = None if call is not None else protocol.unknown_tool_call(r.text, tools.names())
            if protocol.final_answer(r.text) is not None:
                r.finish = "answer"
            elif call is not None and gen.finish_reason == "stop":
                pending.append((i, call))
            elif unknown is not None and gen.finish_reason in ("stop", "eos"):
                # a call to a tool that does not exist: say so, as an observation, and go on
                pending.append((i, protocol.Step("tool", unknown, "")))
            elif gen.finish_reason == "eos":
                r.finish = "eos"
            elif gen.finish_reason == "length":
                # the turn ran into gen.max_new_tokens with budget left: almost always a loop.
                # Not DAPO's "overlong" (that is the response budget above), so it stays in the
                # loss with its reward of 0 and a mixed group gives it a negative advantage.
                r.finish = "turn_length"
            else:
                r.finish = "no_action"
        observations = _run_tools(tools, pending, self.seen_calls, cfg.tool_timeout_s)
        for (i, call), obs in zip(pending, observations):
            r = self.rollouts[i]
            r.tool_calls += 1
            r.tool_errors += 0 if obs.ok else 1
            text = protocol.wrap_observation(observation_text(obs.text, cfg.observation_chars, tools.names()))
            ids = tok(text, add_special_tokens=False)["input_ids"]
            room = cfg.max_response_tokens - len(r.response_ids)
            r.response_ids += ids[:room]
            r.response_mask += [0] * len(ids[:room])
            if r.response_logprobs:  # keep the per-token lists aligned with response_ids
                r.response_logprobs += [0.0] * len(ids[:room])
            r.text += tok.decode(ids[:room], skip_special_tokens=False)
            if len(ids) >= room:
                r.finish, r.truncated = "length", True
            elif self.turns[i] >= cfg.max_turns:
                r.finish = "max_turns"
            else:
                replies[i] = ids
        if self.bar is not None:
            self.bar.update(sum(1 for i, _ in events if self.rollouts[i].done))
        return [replies[i] for i, _ in events]


def observation_text(text: str, observation_chars: int, tool_names=()) -> str:
    """A tool's output as it enters the context, before wrap_observation: cut to
    observation_chars, then its CoA tags escaped exactly as distill/convert.py escapes the
    teacher's (the SFT data), so the policy meets in rollouts the observations it was trained
    on, and a `</answer>` or `</observation>` in tool output cannot end a block. A registry's
    own tool names are escaped too; for the built-in tools this is distill's call exactly."""
    names = tuple(dict.fromkeys((*protocol.DEFAULT_TOOLS, *tool_names)))
    return protocol.escape_tags(text[:observation_chars], names)


def _run_tools(tools, pending, seen_calls, timeout_s: float = 60.0):
    """Every pending call at once, each in its own daemon thread, waited for `timeout_s` from
    the start: a call still running then becomes an error observation and is abandoned (a
    daemon thread cannot keep the process alive, and no pool slot stays taken by it). Tools
    never raise (Tool.__call__ shields them), so a thread only ever stores an Observation."""
    results: list[Observation | None] = [None] * len(pending)
    threads = []
    names = tools.names()
    for k, (i, call) in enumerate(pending):
        if call.tag not in names:
            results[k] = error_observation(f"unknown tool '{call.tag}'; the tools are: {', '.join(sorted(names))}")
            continue
        key = f"{call.tag}\x00{call.content.strip()}"
        if key in seen_calls[i]:
            # AFM's environment answers a repeated identical call with a canned observation.
            results[k] = Observation(text=ALREADY_SEARCHED, ok=False, latency_s=0.0)
            continue
        seen_calls[i].add(key)

        def work(k=k, call=call):
            results[k] = tools.get(call.tag)(call.content)

        thread = threading.Thread(target=work, name=f"tool-{call.tag}", daemon=True)
        thread.start()
        threads.append((k, call, thread))
    deadline = time.monotonic() + timeout_s
    for k, call, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if results[k] is None:  # still running (or died without a result): the rollout goes on
            results[k] = error_observation(f"{call.tag}: no answer within {timeout_s:g} s (timed out)", timeout_s)
    return results


def run_coa_across_ranks(generator, tasks: list, tools, cfg: GenerationConfig, samples: int = 1,
                         temperature: float = 0.0, progress: str | None = None) -> list[Rollout]:
    """`run_coa` with the rows (task x sample) split over the ranks of a launched run
    (coa_lab/distributed.py): each rank rolls out and runs the tools for its contiguous share,
    and every rank gets all the rollouts back, in the order `run_coa` returns them. One rank:
    exactly `run_coa`."""
    if distributed.world_size() <= 1:
        return run_coa(generator, tasks, tools, cfg, samples=samples, temperature=temperature, progress=progress)
    rows = [task for task in tasks for _ in range(samples)]
    mine = [rows[i] for i in distributed.shard(len(rows))]
    local = run_coa(generator, mine, tools, cfg, samples=1, temperature=temperature,
                    progress=progress if distributed.is_main() else None) if mine else []
    return distributed.gather_rows(local)
