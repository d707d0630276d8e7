"""The trajectory record: one CoA trajectory per JSONL line, loadable with HF `datasets`.

    records = load_records("runs/demo/sft/kept.jsonl")
    ds = datasets.load_dataset("json", data_files="runs/demo/sft/kept.jsonl")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

SCHEMA_VERSION = 1


@dataclass
class TrajectoryRecord:
    id: str
    task_id: str
    source: str  # "teacher" (captured MAS run), "fireact", "tora", "rl", ...
    profile: str  # mhqa | math | code | web
    question: str
    answers: list[str]
    text: str  # the CoA assistant turn, observations included
    reward: float | None = None
    n_tokens: int | None = None
    n_tool_calls: int = 0
    metadata: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def save_records(records: list[TrajectoryRecord], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
    tmp.replace(path)  # an interrupted write never clobbers the previous file
    return path


def load_records(path: str | Path) -> list[TrajectoryRecord]:
    """Load records; a broken line raises ValueError naming the file and the line."""
    path = Path(path)
    names = {f.name for f in fields(TrajectoryRecord)}
    required = {"id", "task_id", "source", "profile", "question", "answers", "text"}
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
            missing = required - row.keys()
            if missing:
                raise ValueError(f"{path}:{n}: missing field(s) {sorted(missing)}")
            if row.get("schema_version", SCHEMA_VERSION) > SCHEMA_VERSION:
                raise ValueError(f"{path}:{n}: schema_version {row['schema_version']} is newer than this lab's {SCHEMA_VERSION}")
            out.append(TrajectoryRecord(**{k: v for k, v in row.items() if k in names}))
    return out
