"""Viewer: escaped, role-coloured HTML; real trajectories render; browser logic; SFT mask view."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace

import pytest

from coa_lab import protocol
from coa_lab.distill.importers import load_imported
from coa_lab.paths import DATASETS_DIR
from coa_lab.protocol import block, wrap_observation
from coa_lab.trajectories import TrajectoryRecord, save_records
from coa_lab.viz.browser import TrajectoryBrowser
from coa_lab.viz.plots import plot_curves
from coa_lab.viz.sft_mask import mask_html
from coa_lab.viz.style import ROLE_COLOURS
from coa_lab.viz.trajectory import MASKED_BADGE, show_trajectory, trajectory_html

TRAJ_DIR = DATASETS_DIR / "trajectories"
REAL_FILES = ("fireact_hotpotqa_react.jsonl", "tora70b_gsm8k.jsonl")

VALID_MHQA = "\n".join([
    block("plan", "Find the director, then the birthplace."),
    block("think", "Search first."),
    block("wiki_search", "Inception director"),
    wrap_observation("Inception is directed by Christopher Nolan.").strip("\n"),
    block("think", "Nolan; propose it."),
    block("suggested_answer", "Christopher Nolan"),
    block("double_check", "Score: 4, the page says so."),
    block("answer", "Christopher Nolan"),
])
ALL_ROLES = VALID_MHQA + "\n" + block("reflection", "r")  # renders every role (grammar aside)
OBS_CLASS = re.compile(r'class="coa-step coa-observation[ "]')


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _record(i: int, text: str, source: str = "teacher", profile: str = "mhqa") -> TrajectoryRecord:
    return TrajectoryRecord(id=f"r{i}", task_id=f"t{i}", source=source, profile=profile,
                            question=f"q{i}?", answers=["a"], text=text)


# ----------------------------------------------------------------------------- trajectory_html


def test_every_role_has_its_class_and_colour():
    out = trajectory_html(ALL_ROLES)
    assert set(ROLE_COLOURS) == set(protocol.ROLE_TAGS)  # a new role needs a colour
    for tag in protocol.ROLE_TAGS:
        assert f"coa-role-{tag}" in out
        assert ROLE_COLOURS[tag][0] in out
    assert "coa-legend" in out


def test_tool_call_and_masked_observation():
    out = trajectory_html(VALID_MHQA)
    assert "coa-tool-name" in out and "tool: wiki_search" in out
    assert len(OBS_CLASS.findall(out)) == 1
    assert MASKED_BADGE in out
    unmasked = trajectory_html(VALID_MHQA, show_mask=False)
    assert MASKED_BADGE not in unmasked and len(OBS_CLASS.findall(unmasked)) == 1


def test_content_is_escaped():
    evil = ("<think>hi <script>alert('x')</script> & <b>bold</b></think>\n"
            "<code>print('<script>')</code>\n<observation>\n<img src=x onerror=alert(1)>\n</observation>\n"
            "<script>stray</script><answer>\"1\"</answer>")
    out = trajectory_html(evil, profile="math", title="<script>t</script>")
    assert "<script" not in out.lower()
    assert "<img" not in out and "<b>bold" not in out
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in out
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    assert "&lt;script&gt;t&lt;/script&gt;" in out  # the title too


def test_stray_text_and_problems_listed():
    out = trajectory_html("hello there <think>unfinished", profile="mhqa")
    assert "coa-text" in out and "stray text" in out
    assert "coa-problems" in out and "truncated &lt;think&gt;" in out
    assert "unclosed" in out  # the truncated block is flagged in place
    assert "no &lt;answer&gt; block" in out  # grammar adds what parsing does not


def test_validity_violations_listed():
    bad = block("answer", "42") + "\n" + block("think", "too late") + "\n" + block("code", "print(1)")
    out = trajectory_html(bad, profile="mhqa")
    assert "coa-violations" in out
    for violation in protocol.validate(bad, "mhqa"):
        assert _esc(violation) in out
    assert "coa-valid" not in out
    good = trajectory_html(VALID_MHQA, profile="mhqa")
    assert "coa-valid" in good and "coa-violations" not in good
    assert "coa-violations" not in trajectory_html(bad)  # no profile, no grammar check


def test_unknown_profile_is_reported_not_raised():
    out = trajectory_html(VALID_MHQA, profile="chess")
    assert "cannot validate" in out


def test_long_observation_collapsed():
    long_obs = "\n".join(f"line {i}" for i in range(100))
    out = trajectory_html(block("code", "x") + wrap_observation(long_obs))
    assert "<details>" in out and "line 99" in out
    assert "<details>" not in trajectory_html(VALID_MHQA)


# ----------------------------------------------------------------------------- real trajectories


@pytest.fixture(scope="module")
def real_records():
    records = []
    for name in REAL_FILES:
        imported = load_imported(TRAJ_DIR / name)
        assert imported, name
        records += [t.to_record() for t in imported]
    return records


def test_real_trajectories_render(real_records):
    for rec in real_records:
        out = trajectory_html(rec.text, profile=rec.profile)
        n_obs = sum(1 for s in protocol.parse(rec.text).steps if s.kind == "observation")
        assert len(OBS_CLASS.findall(out)) == n_obs, rec.id
        assert out.count(MASKED_BADGE) == n_obs + 1  # + the legend entry
        assert "<script" not in out.lower()


def test_show_trajectory_accepts_text_record_and_imported(real_records):
    from IPython.display import HTML

    rec = replace(real_records[0], reward=0.75)
    shown = show_trajectory(rec)
    assert isinstance(shown, HTML)
    for field in ("coa-header", rec.source, rec.profile, "0.75", _esc(rec.question)):
        assert field in shown.data
    assert isinstance(show_trajectory(rec.text, profile="mhqa"), HTML)
    imported = load_imported(TRAJ_DIR / REAL_FILES[1])[0]
    assert "coa-header" in show_trajectory(imported).data
    with pytest.raises(TypeError):
        show_trajectory(42)


# ----------------------------------------------------------------------------- browser


@pytest.fixture
def browser():
    bad = block("answer", "x") + block("think", "late")
    records = [_record(0, VALID_MHQA, "teacher"), _record(1, bad, "teacher"), _record(2, VALID_MHQA, "rl"),
               _record(3, bad, "rl"), _record(4, VALID_MHQA, "rl")]
    return TrajectoryBrowser(records)


def test_browser_navigation_wraps(browser):
    assert browser.label == "1 / 5" and browser.current.id == "r0"
    assert browser.prev().id == "r4" and browser.label == "5 / 5"  # wraps backwards
    assert browser.next().id == "r0"  # and forwards
    for expected in ("r1", "r2", "r3", "r4", "r0"):
        assert browser.next().id == expected
    assert "coa-trajectory" in browser.html and "q0?" in browser.html


def test_browser_filters(browser):
    assert browser.set_filter(source="rl") == 3
    assert browser.label == "1 / 3" and browser.current.id == "r2"
    assert browser.set_filter(validity="invalid") == 2  # None lifts the source filter
    assert [browser.records[i].id for i in browser.indices] == ["r1", "r3"]
    assert browser.set_filter(source="rl", validity="valid") == 2
    assert browser.next().id == "r4" and browser.next().id == "r2"
    assert browser.set_filter() == 5
    with pytest.raises(ValueError):
        browser.set_filter(source="nope")
    with pytest.raises(ValueError):
        browser.set_filter(validity="maybe")


def test_browser_dropdowns_drive_the_filter(browser):
    browser._source.value = "teacher"
    assert [browser.records[i].id for i in browser.indices] == ["r0", "r1"]
    browser._validity.value = "valid"
    assert browser.label == "1 / 1" and browser.current.id == "r0"


def test_browser_empty_results_are_friendly():
    b = TrajectoryBrowser([_record(0, VALID_MHQA)])
    assert b.set_filter(validity="invalid") == 0
    assert b.label == "0 / 0" and b.current is None
    assert b.next() is None and b.prev() is None
    assert "coa-empty" in b.html and "No trajectory matches" in b.html
    empty = TrajectoryBrowser([])
    assert empty.label == "0 / 0" and "no trajectories" in empty.html


def test_browser_from_paths_and_widget(tmp_path, real_records):
    path = save_records(real_records[:3], tmp_path / "kept.jsonl")
    b = TrajectoryBrowser(path)
    assert b.label == "1 / 3"
    assert b.widget.__class__.__name__ == "VBox"
    assert "application/vnd.jupyter.widget-view+json" in b._repr_mimebundle_()
    raw = TrajectoryBrowser(TRAJ_DIR / REAL_FILES[0])  # raw FireAct rows, converted on load
    assert len(raw.records) == len(load_imported(TRAJ_DIR / REAL_FILES[0]))
    assert raw.set_filter(validity="valid") == len(raw.records)  # the shipped imports are valid


# ----------------------------------------------------------------------------- mask_html and curves


def test_mask_html_marks_exactly_the_ignored_tokens(real_records):
    from coa_lab.generation.models import load_tokenizer
    from coa_lab.training.sft import IGNORE_INDEX, encode_example, record_messages

    tok = load_tokenizer("embedded")
    rec = real_records[0]
    row = encode_example(tok, record_messages(rec), rec.text)
    out = mask_html(tok, row["input_ids"], row["labels"])
    classes = re.findall(r'class="coa-tok coa-tok-(masked|trained)"', out)
    assert len(classes) == len(row["input_ids"])
    assert [c == "masked" for c in classes] == [label == IGNORE_INDEX for label in row["labels"]]
    assert row["n_observation_tokens"] > 0 and "masked (label -100)" in out
    # Token text is escaped: the tags of the trajectory appear as text, never as markup.
    assert "&lt;" in out and "<observation" not in out


def test_mask_html_rejects_mismatched_lengths():
    from coa_lab.generation.models import load_tokenizer

    with pytest.raises(ValueError):
        mask_html(load_tokenizer("embedded"), [1, 2], [1])


def test_plot_curves():
    fig = plot_curves({"loss": [2.0, 1.5, 1.2], "val": [2.1, 1.9]}, "SFT loss", "loss")
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and ax.get_title() == "SFT loss" and ax.get_ylabel() == "loss"
    assert ax.get_legend() is not None
    assert len(plot_curves({}, "empty", "r").axes[0].lines) == 0


def test_team_run_html_shows_each_agent_with_its_context_tool_and_tokens():
    from coa_lab.capture.teacher import Activation, TeacherRun
    from coa_lab.viz.trajectory import team_run_html

    run = TeacherRun("t1", "What is <6*7>?", "math", ["42"], [
        Activation("planner", [{"role": "system", "content": "You are the planner."}], "compute it", 12, 3),
        Activation("coder", [{"role": "system", "content": "You are the code agent."}], "print(6*7)", 20, 5,
                   tool="code", tool_input="print(6*7)", observation="42<script>", tool_ok=True),
    ], final_answer="42")
    page = team_run_html(run)
    assert page.count('class="coa-agent"') == 2
    assert "You are the code agent." in page and "12 prompt + 3 output tokens" in page
    assert "42&lt;script&gt;" in page and "<script>" not in page  # model and tool text escaped
    assert "&lt;6*7&gt;" in page and "32 tokens" not in page and f"{run.tokens} tokens" in page


def test_save_figure_records_the_numbers_and_the_machine_probe(tmp_path):
    """A notebook figure's JSON carries what it plots, when, and the matmul probe beside it."""
    from coa_lab.viz.plots import save_figure

    fig = plot_curves({"loss": [3.0, 2.0, 1.5]}, title="t")
    path = save_figure(fig, tmp_path / "figures" / "x.png", {"loss": [3.0, 2.0, 1.5]})
    meta = json.loads(path.with_suffix(".json").read_text())
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and meta["figure"] == "x.png"
    assert meta["data"] == {"loss": [3.0, 2.0, 1.5]} and meta["date"]
    probe = meta["probe"]
    assert probe["cores"] >= 1 and probe["fp32_gflops"] > 0 and probe["bf16_gflops"] > 0
    assert isinstance(probe["bf16_autocast"], bool)
    # written outside the repository (as bench_notebooks' scratch copy is), it still names the
    # commit of the code that drew it
    import subprocess

    from coa_lab.paths import PROJECT_ROOT

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=PROJECT_ROOT).stdout.strip()
    if head:  # a git checkout (a copy without .git records None)
        assert meta["commit"].split("+")[0] == head


def test_machine_peak_measures_a_positive_rate():
    import torch

    from coa_lab.machine import matmul_gflops

    assert matmul_gflops(torch.float32, seconds=0.05, size=64) > 0


# ----------------------------------------------------------------------------- RL tokens (notebook 04)


def test_advantage_tokens_html_colours_policy_tokens_and_strikes_observations():
    from coa_lab.generation.models import load_tokenizer
    from coa_lab.viz.rl_tokens import advantage_tokens_html

    tok = load_tokenizer("embedded")
    ids = tok("<think>2+2</think><observation>4 <i>x</i></observation><answer>4</answer>",
              add_special_tokens=False)["input_ids"]
    mask = [0 if 6 <= i < 14 else 1 for i in range(len(ids))]
    for advantage, kind in ((1.2, "up"), (-0.7, "down"), (0.0, "zero")):
        out = advantage_tokens_html(tok, ids, mask, advantage)
        classes = re.findall(r'class="coa-rl-tok coa-rl-(\w+)"', out)
        assert classes == [kind if m else "masked" for m in mask]
        assert "&lt;" in out and "<i>" not in out and "<observation" not in out  # escaped, never markup
    grad = [0.0 if (m == 0 or i % 2) else -0.01 for i, m in enumerate(mask)]
    out = advantage_tokens_html(tok, ids, mask, 1.0, grad=grad, max_tokens=5)
    assert len(re.findall(r'class="coa-rl-tok ', out)) == 5 and f"({len(ids) - 5} more tokens)" in out
    assert "d loss / d log p = -1.00e-02" in out and "opacity:0.45" in out
    with pytest.raises(ValueError, match="response_mask has"):
        advantage_tokens_html(tok, ids, mask[:-1], 1.0)
    with pytest.raises(ValueError, match="grad has"):
        advantage_tokens_html(tok, ids, mask, 1.0, grad=grad[:-1])


def test_live_curves_collect_every_step_and_leave_gaps_where_a_row_has_none():
    import math

    from coa_lab.viz.plots import LiveCurves

    live = LiveCurves({"accuracy": lambda row: row["accuracy"], "gap": lambda row: row.get("logprob_gap")},
                      title="RL", ylabel="fraction")
    live.on_step(0, {"accuracy": 0.5, "logprob_gap": 1e-3})
    live.on_step(1, {"accuracy": 0.75})  # a step without an update logs no gap
    assert live.values["accuracy"] == [0.5, 0.75]
    assert live.values["gap"][0] == 1e-3 and math.isnan(live.values["gap"][1])
    assert live._handle is None  # outside IPython nothing is displayed


def test_a_figure_with_fractional_step_ticks_or_a_clipped_title_is_refused(tmp_path):
    """save_figure refuses what a learner cannot read at a glance; plot_curves draws whole steps."""
    from matplotlib.figure import Figure

    from coa_lab.viz.plots import figure_problems, plot_curves, save_figure

    fine = plot_curves({"accuracy": [0.84, 0.70, 0.80]}, title="RL", first_step=0)
    assert figure_problems(fine) == []
    assert [t for t in fine.axes[0].get_xticks() if 0 <= t <= 2] == [0, 1, 2]
    bad = Figure(figsize=(3, 2))
    ax = bad.add_subplot()
    ax.plot([1, 2, 3], [0.84, 0.70, 0.80])  # matplotlib's default locator ticks 1.25, 1.5, ...
    ax.set_title("a title far too long to fit a figure three inches wide, cut off at both sides")
    problems = figure_problems(bad)
    assert any("fractional x ticks" in p for p in problems) and any("cut off" in p for p in problems)
    with pytest.raises(ValueError, match="not readable at a glance"):
        save_figure(bad, tmp_path / "bad.png", {})
    assert not (tmp_path / "bad.png").exists()


def test_one_step_draws_whole_ticks():
    """A smoke run's single RL step: matplotlib pads a one-point axis to ±0.045; plot_curves does not."""
    from coa_lab.viz.plots import figure_problems, plot_curves

    assert figure_problems(plot_curves({"accuracy": [0.5]}, first_step=0)) == []
