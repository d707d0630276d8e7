"""Capture that survives: the teacher over many tasks, one JSON line per finished run,
resumable after a crash at any moment.

    result = capture_runs(backend, tasks, tools, preset, run / "capture" / "traces.jsonl")

How the work is cut:
- a **local** model (HFGenerator) is fastest in lockstep: `run_teacher` on batches of up to
  `capture.batch_tasks` tasks, one batched generate per agent; each batch is flushed when it ends;
- a **remote** teacher (`backend.concurrent`, an OpenAI-compatible server) is fastest with many
  requests in flight: every task is its own run, `capture.concurrency` of them side by side, each
  flushed as it ends.

Why it cannot lose or duplicate a run: each finished run is ONE `write` of one line, then
flush + fsync; a run is in the file completely or (killed mid-write) as a torn last line with
no newline. On resume the torn line is cut off, runs that failed for good (a remote error)
are dropped so they are retried, and only tasks without a run are captured: every task ends
up in the file exactly once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from coa_lab.capture.teacher import TeacherRun, run_teacher
from coa_lab.config import Preset
from coa_lab.generation.llm import make_generator
from coa_lab.generation.openai_backend import OpenAIChatBackend
from coa_lab.progress import progress_bar


class CaptureError(RuntimeError):
    pass


@dataclass
class CaptureResult:
    runs: list[TeacherRun]  # every run in the file, kept ones first, then this call's
    resumed: int  # runs already in the file and kept
    captured: int  # runs added by this call
    failed: int  # of all runs, those recorded with an error (retried on the next resume)
    dropped_torn_line: bool  # a half-written last line (a crash mid-write) was cut off
    seconds: float


def read_traces(path: Path) -> tuple[list[TeacherRun], bool]:
    """The complete runs of a traces file, and whether its last line was torn (cut off mid-
    write: no newline, or not a whole record) and left out. A bad line anywhere else is not a
    crash's signature and raises: something else wrote into the file."""
    data = path.read_bytes() if path.exists() else b""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the file ends with a newline, as a whole file does
    runs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if n == len(lines) and not data.endswith(b"\n"):
                raise ValueError("no newline: cut off mid-write")
            runs.append(TeacherRun.from_dict(json.loads(line)))
        except (ValueError, TypeError, KeyError) as exc:
            if n == len(lines):
                return runs, True
            raise CaptureError(f"{path}:{n}: not a teacher run record ({exc}); "
                               "only the last line may be cut off by a crash") from exc
    return runs, False


class TraceWriter:
    """Appends runs to a JSONL file, one line per `write`, flushed and fsynced, thread-safe."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "ab")
        self._lock = threading.Lock()

    def append(self, run: TeacherRun) -> None:
        line = (json.dumps(run.to_dict()) + "\n").encode()
        with self._lock:
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _rewrite(path: Path, runs: list[TeacherRun]) -> None:
    """Replace the file by `runs` atomically (a temp file renamed over it)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        for r in runs:
            f.write((json.dumps(r.to_dict()) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_teacher(meta: Path, teacher: str, resume: bool) -> None:
    """A resumed capture must continue with the same teacher, or the traces mix two teachers."""
    if resume and meta.exists():
        before = json.loads(meta.read_text()).get("teacher")
        if before != teacher:
            raise CaptureError(f"{meta.parent} was captured with teacher {before!r}, not {teacher!r}: "
                               "use another run folder (or delete its traces) to capture with a new teacher")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"teacher": teacher}))


def lockstep_batches(tasks: list, batch_tasks: int) -> list[list]:
    """Equal batches of at most `batch_tasks` (72 tasks at 64: 36 + 36, not 64 + 8)."""
    if not tasks:
        return []
    n = -(-len(tasks) // max(1, batch_tasks))
    size = -(-len(tasks) // n)
    return [tasks[i : i + size] for i in range(0, len(tasks), size)]


def capture_runs(backend, tasks: list, tools, preset: Preset, path: str | Path, *, teacher: str | None = None,
                 resume: bool = True, progress: bool = True) -> CaptureResult:
    """Run the teacher on every task without a run in `path` yet, appending each run as it ends.

    preset: its `capture` section (hops, batching, concurrency) and `gen.observation_chars` (tool
    output cut as the student will see it). teacher: the name recorded with the traces (default
    `teacher_name(preset)`); a file captured by another teacher is not resumed.

    resume=False starts the file afresh. Runs already in the file for tasks not in `tasks` are
    kept (nothing is lost) and returned with the rest. Raises AuthError (the key was rejected) after keeping
    every run finished so far; any other backend failure is a recorded failed run."""
    cfg, observation_chars = preset.capture, preset.gen.observation_chars
    teacher = teacher or teacher_name(preset)
    t0 = time.time()
    path = Path(path)
    _check_teacher(path.with_name("capture_meta.json"), teacher, resume)
    kept, torn = [], False
    if resume and path.exists():
        found, torn = read_traces(path)
        kept = [r for r in found if r.error is None]
        if torn or len(kept) < len(found):
            _rewrite(path, kept)  # cut the torn line, drop failed runs: they are retried below
    elif path.exists():
        path.unlink()
    have = {r.task_id for r in kept}
    todo, seen = [], set(have)
    for t in tasks:  # a task listed twice is still captured once
        if t.id not in seen:
            todo.append(t)
            seen.add(t.id)
    remote = bool(getattr(backend, "concurrent", False))
    units = [[t] for t in todo] if remote else lockstep_batches(todo, cfg.batch_tasks)
    workers = max(1, getattr(backend, "concurrency", cfg.concurrency)) if remote else 1

    writer = TraceWriter(path)
    bar = progress_bar(total=len(seen), initial=len(seen) - len(todo), desc="capture", unit="run", disable=not progress)
    new: list[TeacherRun] = []
    lock = threading.Lock()

    def run_unit(unit: list) -> None:
        runs = run_teacher(backend, unit, tools, cfg, observation_chars)
        for r in runs:
            writer.append(r)
        with lock:
            new.extend(runs)
            bar.update(len(runs))
            bar.set_postfix(failed=sum(1 for r in new if r.error))

    try:
        if workers == 1:
            for unit in units:
                run_unit(unit)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(run_unit, u) for u in units]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                errors = [f.exception() for f in done if f.exception() is not None]
                if errors:  # stop what has not started; what is running finishes and is kept
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise errors[0]
    finally:
        bar.close()
        writer.close()
    runs = kept + new
    return CaptureResult(runs, len(kept), len(new), sum(1 for r in runs if r.error), torn,
                         round(time.time() - t0, 1))


def make_teacher(preset):
    """The preset's teacher backend: a remote OpenAI-compatible endpoint when
    `capture.teacher_url` is set, else a local model (the preset's or `capture.teacher_model`)."""
    c = preset.capture
    if c.teacher_url:
        if not c.teacher_model:
            raise ValueError("capture.teacher_url needs capture.teacher_model: the model name the server serves")
        return OpenAIChatBackend(c.teacher_url, c.teacher_model, api_key_env=c.teacher_api_key_env,
                                 concurrency=c.concurrency, max_retries=c.max_retries)
    # the agents' instructions and worked examples: prefilled once per capture, not per batch
    return make_generator(preset, model_name=c.teacher_model, keep_prefixes=True)


def teacher_name(preset) -> str:
    c = preset.capture
    name = c.teacher_model or preset.model.name
    return f"{name} @ {c.teacher_url}" if c.teacher_url else name
