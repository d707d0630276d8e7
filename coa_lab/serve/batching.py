"""`coa-lab serve`'s engine: requests that arrive together are decoded together.

A worker thread takes everything queued (up to `max_batch` rows, same sampling settings and
same adapter) and runs ONE batched generate; adapters are loaded, switched and removed on that
same thread, between batches (the model is not thread-safe)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from coa_lab.serve.adapters import LoraAdapters


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    adapter: str | None = None  # a runtime LoRA adapter's name; None: the model as served
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        return (self.adapter, self.max_tokens, self.temperature, self.top_p, self.stop)


@dataclass
class _Call:
    """Work for the engine thread between batches (loading or removing an adapter)."""
    fn: Callable[[], object]
    future: Future = field(default_factory=Future)



class BatchingEngine:
    """Decodes queued jobs in batches on one worker thread (the model is not thread-safe).

    generator: anything with `.tokenizer` and `.generate(prompts, max_new_tokens, temperature,
    top_p, stop)` (coa_lab.generation.hf_generator.HFGenerator). wait_s: how long the worker lingers for more jobs
    once one arrives (requests of one client burst arrive a few ms apart). adapters: what
    switches LoRA adapters around a batch (default: LoraAdapters on generator.model)."""

    def __init__(self, generator, max_batch: int = 32, wait_s: float = 0.02, adapters=None):
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self.adapters = adapters if adapters is not None else LoraAdapters(generator)
        self.batches = 0  # for tests and /health: how many batched generate calls ran
        self._queue: queue.Queue[Job | _Call] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="coa-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future:
        self._queue.put(job)
        return job.future

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread, after the jobs queued before it."""
        item = _Call(fn)
        self._queue.put(item)
        return item.future

    def _take(self) -> list[Job | _Call]:
        items = [self._queue.get()]
        deadline = time.monotonic() + self.wait_s
        while len(items) < self.max_batch and not isinstance(items[-1], _Call):
            try:
                items.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return items

    def _loop(self) -> None:
        while True:
            items = self._take()
            groups: dict[tuple, list[Job]] = {}
            for j in items:
                if isinstance(j, Job):
                    groups.setdefault(j.key, []).append(j)
            for (adapter, max_tokens, temperature, top_p, stop), group in groups.items():
                try:
                    with self.adapters.active(adapter):  # one adapter per batch
                        gens = self.generator.generate([j.prompt for j in group], max_tokens, temperature, top_p,
                                                       stop)
                    self.batches += 1
                except Exception as exc:  # a failed batch fails its requests, not the server
                    for j in group:
                        j.future.set_exception(exc)
                    continue
                for j, g in zip(group, gens):
                    j.future.set_result(g)
            for c in items:  # _take ends a list at its first call: the jobs before it ran first
                if isinstance(c, _Call):
                    try:
                        c.future.set_result(c.fn())
                    except Exception as exc:
                        c.future.set_exception(exc)

