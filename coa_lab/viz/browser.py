"""Page through a file of trajectories in a notebook, filtered by source and grammar validity.

    TrajectoryBrowser("runs/demo/sft/kept.jsonl")
"""

from __future__ import annotations

import json
from pathlib import Path

from coa_lab.distill.importers import detect_trajectory_format, load_imported
from coa_lab.trajectories import TrajectoryRecord, load_records
from coa_lab.viz.style import FONT, esc
from coa_lab.viz.trajectory import as_record, grammar_violations, record_html

SOURCE_ALL = "all"
VALIDITY_CHOICES = ("all", "valid", "invalid")


def _load_path(path: str | Path) -> list[TrajectoryRecord]:
    """Records JSONL, or a raw FireAct/ToRA file (converted on the fly by the importers)."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        row = json.loads(first) if first else {}
    except json.JSONDecodeError:
        row = {}  # let load_records name the broken line
    if isinstance(row, dict) and row and "text" not in row:
        if detect_trajectory_format(row) is not None:
            return [t.to_record() for t in load_imported(path)]
    return load_records(path)


def _is_valid(record: TrajectoryRecord) -> bool:
    return not grammar_violations(record.text, record.profile, None)


class TrajectoryBrowser:
    """Page through trajectories with Previous/Next, filtered by source and grammar validity.

    Navigation wraps around: Next on the last match shows the first, Previous on the first
    shows the last. The logic (next/prev/set_filter, position, current, html) works without
    a notebook frontend; `.widget` is the ipywidgets VBox.
    """

    def __init__(self, records_or_path, show_mask: bool = True):
        import ipywidgets as w

        if isinstance(records_or_path, (str, Path)):
            records = _load_path(records_or_path)
        else:
            records = [as_record(r) for r in records_or_path]
        self.records: list[TrajectoryRecord] = records
        self.show_mask = show_mask
        self._valid: dict[int, bool] = {}  # validated lazily: only when filtering by validity
        self.indices: list[int] = list(range(len(records)))
        self.position = 0
        self._syncing = False

        sources = sorted({r.source for r in records})
        self._prev_button = w.Button(description="Previous", icon="arrow-left")
        self._next_button = w.Button(description="Next", icon="arrow-right")
        self._label = w.Label()
        self._source = w.Dropdown(options=[SOURCE_ALL, *sources], value=SOURCE_ALL, description="source")
        self._validity = w.Dropdown(options=list(VALIDITY_CHOICES), value="all", description="validity")
        self._output = w.HTML()
        self._prev_button.on_click(lambda _: self.prev())
        self._next_button.on_click(lambda _: self.next())
        self._source.observe(self._on_dropdown, names="value")
        self._validity.observe(self._on_dropdown, names="value")
        controls = w.HBox([self._prev_button, self._label, self._next_button, self._source, self._validity])
        self.widget = w.VBox([controls, self._output])
        self._render()

    # -- filtering

    def valid(self, index: int) -> bool:
        """Whether records[index] follows its profile's grammar (cached)."""
        if index not in self._valid:
            self._valid[index] = _is_valid(self.records[index])
        return self._valid[index]

    def _matches(self, index: int, source: str, validity: str) -> bool:
        if source != SOURCE_ALL and self.records[index].source != source:
            return False
        if validity == "all":
            return True
        return self.valid(index) == (validity == "valid")

    def set_filter(self, source: str | None = None, validity: str | None = None) -> int:
        """Show only records of `source` and `validity` ("valid"/"invalid"); None or "all"
        lifts that filter. Jumps to the first match and returns the number of matches."""
        source = source or SOURCE_ALL
        validity = validity or "all"
        if source not in self._source.options:
            raise ValueError(f"unknown source {source!r}; choose from {list(self._source.options)}")
        if validity not in VALIDITY_CHOICES:
            raise ValueError(f"unknown validity {validity!r}; choose from {list(VALIDITY_CHOICES)}")
        # Keep the dropdowns in step without their observers re-entering set_filter.
        self._syncing = True
        try:
            self._source.value, self._validity.value = source, validity
        finally:
            self._syncing = False
        self.indices = [i for i in range(len(self.records)) if self._matches(i, source, validity)]
        self.position = 0
        self._render()
        return len(self.indices)

    def _on_dropdown(self, _change) -> None:
        if not self._syncing:
            self.set_filter(self._source.value, self._validity.value)

    # -- navigation

    @property
    def current(self) -> TrajectoryRecord | None:
        return self.records[self.indices[self.position]] if self.indices else None

    def next(self) -> TrajectoryRecord | None:
        if self.indices:
            self.position = (self.position + 1) % len(self.indices)
        self._render()
        return self.current

    def prev(self) -> TrajectoryRecord | None:
        if self.indices:
            self.position = (self.position - 1) % len(self.indices)
        self._render()
        return self.current

    # -- display

    @property
    def label(self) -> str:
        return self._label.value

    @property
    def html(self) -> str:
        return self._output.value

    def _empty_message(self) -> str:
        if not self.records:
            why = "This collection has no trajectories."
        else:
            why = (f"No trajectory matches source = {self._source.value!r} and validity = "
                   f"{self._validity.value!r}. Choose 'all' in a filter to see more.")
        return f'<div class="coa-empty" style="{FONT};color:#666;padding:12px">{esc(why)}</div>'

    def _render(self) -> None:
        n = len(self.indices)
        self._label.value = f"{self.position + 1 if n else 0} / {n}"
        self._prev_button.disabled = self._next_button.disabled = n <= 1
        record = self.current
        self._output.value = self._empty_message() if record is None else record_html(record, self.show_mask)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
