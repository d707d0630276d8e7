"""The trajectory record: one CoA trajectory per JSONL line, loadable with HF `datasets`.

    records = load_records("runs/demo/sft/kept.jsonl")
    ds = datasets.load_dataset("json", data_files="runs/demo/sft/kept.jsonl")

Every saved line carries ``steps``: the parsed block spans of ``text`` (``{kind, tag, start,
end}``, character offsets from :func:`coa_lab.protocol.parse`), so a reader in another
language or a `datasets.map` can slice roles and observations without our parser.  Files
written before ``steps`` existed load unchanged (their records get an empty list).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from coa_lab.protocol import DEFAULT_TOOLS, PROFILE_TOOLS, parse

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
    # Derived from `text` (see compute_steps), hence left out of ==: a record is the same
    # record whether or not its spans have been computed yet. Last, so positional
    # construction of the fields above keeps working.
    steps: list[dict] = field(default_factory=list, compare=False)


def compute_steps(text: str, profile: str = "") -> list[dict]:
    """``{kind, tag, start, end}`` of every block of ``text`` and of any stray
    (non-whitespace) text between blocks; the newlines that join blocks are left out."""
    tools = (*DEFAULT_TOOLS, *PROFILE_TOOLS.get(profile, ()))
    return [{"kind": s.kind, "tag": s.tag, "start": s.start, "end": s.end}
            for s in parse(text, tools).steps if s.kind != "text" or s.content.strip()]


def _with_steps(record: TrajectoryRecord) -> TrajectoryRecord:
    # A copy, so saving never mutates the caller's records.
    if record.steps or not isinstance(record.text, str):
        return record
    return replace(record, steps=compute_steps(record.text, record.profile))


def save_records(records: list[TrajectoryRecord], path: str | Path) -> Path:
    """Write records as JSON lines (atomically); records without ``steps`` get them computed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(_with_steps(r)), ensure_ascii=False) + "\n")
    tmp.replace(path)  # an interrupted write never clobbers the previous file
    return path


def load_records(path: str | Path) -> list[TrajectoryRecord]:
    """Load records; a broken line raises ValueError naming the file and the line."""
    path = Path(path)
    names = {f.name for f in fields(TrajectoryRecord)}
    required = {"id", "task_id", "source", "profile", "question", "answers", "text"}
    out = []
    with open(path, encoding="utf-8") as f:
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
            version = row.get("schema_version", SCHEMA_VERSION)
            if not isinstance(version, int):
                raise ValueError(f"{path}:{n}: schema_version must be an integer, got {version!r}")
            if version > SCHEMA_VERSION:
                raise ValueError(f"{path}:{n}: schema_version {row['schema_version']} is newer than this lab's {SCHEMA_VERSION}")
            if not isinstance(row.get("steps", []), list):
                raise ValueError(f"{path}:{n}: steps must be a list, got {type(row['steps']).__name__}")
            out.append(TrajectoryRecord(**{k: v for k, v in row.items() if k in names}))
    return out
