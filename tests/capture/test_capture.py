"""Capture that survives (capture/recorder.py): runs appended line by line, a torn last line
cut off, failed runs retried, every task exactly once after a SIGKILL, and a remote teacher
captured concurrently through retries."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from coa_lab.capture.recorder import CaptureError, capture_runs, lockstep_batches, read_traces
from coa_lab.capture.teacher import TeacherRun, run_teacher
from coa_lab.config import CaptureConfig, Preset, get_preset
from coa_lab.generation.openai_backend import AuthError, BackendError, OpenAIChatBackend
from coa_lab.generation.result import Generation
from coa_lab.serve.stub_teacher import REPLIES, serve_in_thread, stub_app
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools

TOOLS = build_tools(["code"])


def with_capture(**capture) -> Preset:
    """cpu-smoke with this capture section: capture_runs reads its settings from the preset."""
    return dataclasses.replace(get_preset("cpu-smoke"), capture=CaptureConfig(**capture))


def tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", f"What is {i} times 7?", [str(7 * i)], "test", "math", {}) for i in range(n)]


class Agents:
    """A local-style (lockstep) teacher answering by system prompt; can fail chosen tasks."""

    def __init__(self, fail_on: str | None = None, auth_fail_on: str | None = None):
        self.calls = []
        self.fail_on, self.auth_fail_on = fail_on, auth_fail_on

    def chat(self, conversations, max_new_tokens, temperature=0.0):
        self.calls.append(len(conversations))
        for msgs in conversations:
            if self.fail_on and self.fail_on in msgs[-1]["content"]:
                raise BackendError("HTTP 500 after 7 tries")
            if self.auth_fail_on and self.auth_fail_on in msgs[-1]["content"]:
                raise AuthError("rejected the key")
        return [Generation([], REPLIES.get(m[0]["content"], "ok"), "eos", 10, 2) for m in conversations]


def ids(path) -> list[str]:
    return [json.loads(line)["task_id"] for line in path.read_text().splitlines()]


def test_lockstep_batches_are_equal():
    assert [len(b) for b in lockstep_batches(list(range(72)), 64)] == [36, 36]
    assert [len(b) for b in lockstep_batches(list(range(5)), 2)] == [2, 2, 1]
    assert lockstep_batches([], 8) == []


def test_runs_are_appended_as_batches_finish_and_a_resume_captures_only_the_rest(tmp_path):
    path = tmp_path / "traces.jsonl"
    cfg = with_capture(batch_tasks=2)
    first = capture_runs(Agents(), tasks(3), TOOLS, cfg, path, teacher="t", progress=False)
    assert (first.resumed, first.captured, first.failed) == (0, 3, 0)
    assert ids(path) == ["t0", "t1", "t2"]
    backend = Agents()
    again = capture_runs(backend, tasks(5), TOOLS, cfg, path, teacher="t", progress=False)
    assert (again.resumed, again.captured) == (3, 2)
    assert ids(path) == ["t0", "t1", "t2", "t3", "t4"]
    assert set(backend.calls) == {2}  # only t3, t4 were run (lockstep: one call of 2 per agent)
    assert [r.task_id for r in again.runs] == ids(path)


def test_a_torn_last_line_is_cut_off_and_that_task_captured_again(tmp_path):
    path = tmp_path / "traces.jsonl"
    capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="t", progress=False)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 40])  # the second run cut off mid-write: no newline
    runs, torn = read_traces(path)
    assert [r.task_id for r in runs] == ["t0"] and torn
    result = capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="t", progress=False)
    assert result.dropped_torn_line and result.captured == 1
    assert ids(path) == ["t0", "t1"]
    for line in path.read_text().splitlines():
        TeacherRun.from_dict(json.loads(line))  # every line a whole record


def test_a_bad_line_that_is_not_the_last_is_an_error_not_silently_dropped(tmp_path):
    path = tmp_path / "traces.jsonl"
    capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="t", progress=False)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0][:50], lines[1]]) + "\n")
    with pytest.raises(CaptureError, match=r"traces.jsonl:1"):
        capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="t", progress=False)


def test_a_failed_task_is_recorded_then_retried_on_resume(tmp_path):
    path = tmp_path / "traces.jsonl"
    cfg = with_capture(batch_tasks=1)
    result = capture_runs(Agents(fail_on="What is 1 times"), tasks(3), TOOLS, cfg, path, teacher="t", progress=False)
    assert result.failed == 1 and len(result.runs) == 3
    failed = next(r for r in result.runs if r.error)
    assert failed.task_id == "t1" and "HTTP 500" in failed.error and failed.activations == []
    resumed = capture_runs(Agents(), tasks(3), TOOLS, cfg, path, teacher="t", progress=False)
    assert resumed.failed == 0 and resumed.captured == 1
    assert sorted(ids(path)) == ["t0", "t1", "t2"]  # exactly once each


def test_a_rejected_key_stops_the_capture_and_keeps_what_finished(tmp_path):
    path = tmp_path / "traces.jsonl"
    with pytest.raises(AuthError):
        capture_runs(Agents(auth_fail_on="What is 2 times"), tasks(4), TOOLS, with_capture(batch_tasks=1), path,
                     teacher="t", progress=False)
    assert ids(path) == ["t0", "t1"]


def test_resuming_with_another_teacher_is_refused(tmp_path):
    path = tmp_path / "traces.jsonl"
    capture_runs(Agents(), tasks(1), TOOLS, with_capture(), path, teacher="model-a", progress=False)
    with pytest.raises(CaptureError, match="model-a"):
        capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="model-b", progress=False)
    fresh = capture_runs(Agents(), tasks(2), TOOLS, with_capture(), path, teacher="model-b", resume=False,
                         progress=False)
    assert fresh.resumed == 0 and ids(path) == ["t0", "t1"]


def test_remote_teacher_through_429s_and_500s_records_every_task(tmp_path):
    """32 tasks, 8 in flight, a server failing a quarter of its requests: every task recorded,
    none failed, requests really overlapped."""
    app = stub_app(delay_s=0.05, fail_rate=0.25, seed=1)
    with serve_in_thread(app) as url:
        backend = OpenAIChatBackend(url, "stub-teacher", concurrency=8, max_retries=12, backoff_s=0.01,
                                    max_backoff_s=0.1)
        result = capture_runs(backend, tasks(32), TOOLS, with_capture(concurrency=8), tmp_path / "traces.jsonl",
                              teacher="stub", progress=False)
    stats = app.state.stats
    assert result.captured == 32 and result.failed == 0
    assert sorted(ids(tmp_path / "traces.jsonl")) == sorted(t.id for t in tasks(32))
    assert stats["failed"] > 0 and backend.retries == stats["failed"]
    assert stats["max_in_flight"] > 1
    run = result.runs[0]
    assert [a.agent for a in run.activations] == ["planner", "thinker", "coder", "reflector", "thinker", "answerer"]
    assert run.activations[2].observation.strip() == "42" and run.tokens > 0


def test_openai_backend_gives_up_with_a_clear_error_and_no_key_in_it(monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-secret-123")
    with serve_in_thread(stub_app(delay_s=0.0, fail_rate=1.0)) as url:
        backend = OpenAIChatBackend(url, "stub-teacher", api_key_env="STUB_KEY", max_retries=2, backoff_s=0.0)
        with pytest.raises(BackendError, match="failed 3 times") as info:
            backend.chat([[{"role": "user", "content": "hi"}]], 8)
    assert "sk-secret-123" not in str(info.value) and backend.requests == 3


def test_sigkill_mid_capture_then_resume_gives_every_task_exactly_once(tmp_path):
    """A capture in a subprocess (the CLI, a remote stub teacher) is SIGKILLed once some runs
    are on disk; `coa-lab capture` again on the same folder finishes it."""
    run = tmp_path / "run"
    traces = run / "capture" / "traces.jsonl"
    n = 16
    with serve_in_thread(stub_app(delay_s=0.1, fail_rate=0.1, seed=2)) as url:
        cmd = [sys.executable, "-m", "coa_lab.cli", "capture", "--preset", "cpu-smoke", "--run", str(run),
               "--set", f'capture.tasks={{"math/arith": {n}}}', "--set", "capture.multi_hop_tasks={}",
               "--set", f"capture.teacher_url={url}",
               "--set", "capture.teacher_model=stub-teacher", "--set", "capture.concurrency=2"]
        env = {**os.environ, "TQDM_DISABLE": "1"}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while not (traces.exists() and traces.read_text().count("\n") >= 3):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the capture wrote nothing in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = traces.read_text().count("\n")
        assert 3 <= written < n, f"killed too late to test a resume ({written} of {n} runs written)"
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = traces.read_text().splitlines()
    assert len(lines) == n and traces.read_text().endswith("\n")
    runs = [TeacherRun.from_dict(json.loads(line)) for line in lines]
    assert len({r.task_id for r in runs}) == n and all(r.error is None for r in runs)
    summary = json.loads((run / "capture" / "summary.json").read_text())
    assert summary["resumed"] == written and summary["captured"] == n - written
    assert summary["success"]["all"]["agent_calls_per_task"] == 6


@pytest.mark.model
def test_in_process_teacher_capture_flushes_each_lockstep_batch(tmp_path):
    """The local embedded model as the teacher: lockstep batches, each agent its own context."""
    from coa_lab.config import get_preset
    from coa_lab.generation.llm import make_generator

    preset = get_preset("cpu-smoke")
    backend = make_generator(preset, keep_prefixes=True)  # as make_teacher builds it
    path = tmp_path / "traces.jsonl"
    result = capture_runs(backend, tasks(3), TOOLS, with_capture(batch_tasks=2, teacher_max_new_tokens=24), path,
                          teacher=preset.model.name, progress=False)
    assert result.captured == 3 and result.failed == 0 and ids(path) == ["t0", "t1", "t2"]
    # each agent's instruction + worked examples prefilled once, then reused by the next batch
    assert backend.prefix_cache.entries
    assert backend.stats["prompt_tokens_prefilled"] < backend.stats["prompt_tokens_sent"] / 2
    for run in result.runs:
        systems = [a.messages[0]["content"] for a in run.activations]
        assert len(set(systems)) == 5 and run.tool_calls == 1
        assert all(a.prompt_tokens > 0 for a in run.activations)


def test_a_malformed_answer_is_a_failed_run_not_a_crash(tmp_path):
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()

    @app.post("/v1/chat/completions")
    def broken():
        return PlainTextResponse("<html>gateway says hi</html>")

    with serve_in_thread(app) as url:
        backend = OpenAIChatBackend(url, "m", max_retries=0)
        result = capture_runs(backend, tasks(2), TOOLS, with_capture(), tmp_path / "t.jsonl", teacher="m",
                              progress=False)
    assert result.failed == 2 and all("not JSON" in r.error for r in result.runs)


def test_the_multi_hop_share_never_meets_the_capture_tasks_or_the_rl_pool():
    from coa_lab.config import get_preset
    from coa_lab.pipeline import draw_tasks, multi_hop_tasks

    for name in ("cpu-tiny", "cpu-quick", "cpu-smoke"):
        preset = get_preset(name)
        multi = multi_hop_tasks(preset)
        assert len(multi) == sum(preset.capture.multi_hop_tasks.values()) > 0
        used = {t.id for t in draw_tasks(preset, preset.capture.tasks, "train")}
        used |= {t.id for t in draw_tasks(preset, preset.rl.pool, "train", skip=preset.capture.tasks)}
        assert not used & {t.id for t in multi}, name
    # the same tasks for both demo presets: they share capture, so they share the SFT student
    assert [t.id for t in multi_hop_tasks(get_preset("cpu-tiny"))] == [t.id for t in multi_hop_tasks(get_preset("cpu-quick"))]
    # a share that would reach the front of the order is refused, naming the fix
    too_many = get_preset("cpu-tiny", capture={"multi_hop_tasks": {"mhqa/lookup": 600}})
    with pytest.raises(ValueError, match="ask for fewer"):
        multi_hop_tasks(too_many)


def test_a_run_records_the_hops_it_was_given_and_old_records_still_load(tmp_path):
    runs = run_teacher(Agents(), tasks(2), TOOLS, CaptureConfig(max_hops=2))
    assert [r.hops for r in runs] == [2, 2] and [r.tool_calls for r in runs] == [2, 2]
    old = runs[0].to_dict()
    del old["hops"]  # a traces file written before the field existed
    assert TeacherRun.from_dict(old).hops is None
