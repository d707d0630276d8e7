"""AFM RL parquet: our writer matches the release's layout and round-trips through the loader;
the release's own files load, their prompts parse and render as escaped HTML; the prompts
written into those rows (coa_system_prompt) follow the grammar they teach."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from coa_lab import protocol
from coa_lab.paths import DATASETS_DIR
from coa_lab.prompts import EXAMPLES, coa_system_prompt
from coa_lab.tasks import Task, load_suite
from coa_lab.tasks.afm_format import save_afm_parquet, to_afm_rows
from coa_lab.tasks.loaders import load_tasks
from coa_lab.viz.trajectory import trajectory_html

SHARED_AFM = Path("/work/shared/datasets/afm_benchmarks")
SHIPPED_PARQUETS = sorted(DATASETS_DIR.rglob("*.parquet"))
SHARED_PARQUETS = sorted(SHARED_AFM.glob("*.parquet")) if SHARED_AFM.exists() else []


def _same(tasks: list[Task], back: list[Task]) -> None:
    assert len(back) == len(tasks)
    for a, b in zip(tasks, back):
        assert (b.id, b.question, b.answers, b.profile) == (a.id, a.question.strip(), a.answers, a.profile), a.id


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("suite, split", [("math", "train"), ("math", "eval"), ("mhqa", "train"),
                                          ("mhqa", "eval"), ("code", "train"), ("code", "eval")])
def test_round_trip_through_the_loader(tmp_path, suite, split):
    tasks = load_suite(suite, split)
    back = load_tasks(save_afm_parquet(tasks, tmp_path / f"{suite}_{split}.parquet"))
    _same(tasks, back)
    if suite == "code":
        for a, b in zip(tasks, back):
            ta, tb = a.metadata["tests"], b.metadata["tests"]
            if ta["style"] == "stdio":
                assert tb == {**ta, "entry_point": None, "prompt": None, "setup": ""}, a.id
            else:  # one functional program holding the setup and every case
                assert tb["style"] == "assert" and all(c in tb["cases"][0] for c in ta["cases"]), a.id


def test_tuple_shaped_math_answers_round_trip(tmp_path):
    task = Task("math500-x", "Solve for (x, y).", ["(-2,1)"], "math500", "math")
    (back,) = load_tasks(save_afm_parquet([task], tmp_path / "t.parquet"))
    assert back.answers == ["(-2,1)"]


def test_rows_match_the_release_layout(tmp_path):
    math = load_suite("math", "eval", benchmark="aime24")
    (row,) = to_afm_rows(math[:1])
    assert list(row) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert row["prompt"] == [{"content": f"{coa_system_prompt('math')}\n\nTask:\n{math[0].question.strip()}",
                              "role": "user"}]
    assert row["reward_model"] == {"ground_truth": math[0].answers[0], "style": "rule"}
    assert row["extra_info"] == {"index": math[0].id.removeprefix(f"{math[0].source}-"), "need_tools_kwargs": True,
                                 "split": "test", "tools_kwargs": {"code": {"TODO": "create_kwargs"}}}
    mhqa = to_afm_rows(load_suite("mhqa", "eval", benchmark="triviaqa")[:1])[0]
    assert isinstance(mhqa["reward_model"]["ground_truth"]["target"], list)  # Search-R1 style, aliases kept
    if (SHARED_AFM / "aime24.parquet").exists():
        # Column and nested field types identical to a file of the release.
        ours = pq.read_schema(save_afm_parquet(math, tmp_path / "aime24.parquet"))
        theirs = pq.read_schema(SHARED_AFM / "aime24.parquet")
        assert ours.remove_metadata() == theirs.remove_metadata()


def test_code_rows_use_the_release_types(tmp_path):
    ours = pq.read_schema(save_afm_parquet(load_suite("code", "eval", benchmark="apps")[:3], tmp_path / "apps.parquet"))
    theirs = pq.read_schema(DATASETS_DIR / "code/livecodebench/livecodebench_v4.parquet")
    for name in ("data_source", "prompt", "ability", "reward_model"):
        assert ours.field(name).type == theirs.field(name).type, name
    their_extra = {f.name: f.type for f in theirs.field("extra_info").type}
    for f in ours.field("extra_info").type:  # a subset of the release's extra_info, same types
        assert their_extra[f.name] == f.type, f.name


@pytest.mark.parametrize("task, match", [
    (Task("w-1", "Who?", ["x"], "gaia", "web"), "no AFM RL layout"),
    (Task("m-1", "Task: add 1 and 1", ["2"], "gsm8k", "math"), "contains 'Task:'"),
    (Task("q-1", "Who?", ["x"], "fireact", "mhqa"), "read back as math"),
    (Task("m-2", "What?", ["1", "2"], "gsm8k", "math"), "one answer"),
])
def test_rows_the_loader_could_not_read_back_are_refused(task, match):
    with pytest.raises(ValueError, match=match):
        to_afm_rows([task])


def test_mixed_ground_truth_shapes_need_separate_files(tmp_path):
    tasks = load_suite("math", "eval", benchmark="aime24")[:1] + load_suite("mhqa", "eval", benchmark="nq")[:1]
    with pytest.raises(ValueError, match="separate files"):
        save_afm_parquet(tasks, tmp_path / "mixed.parquet")


# --------------------------------------------------------------------------- release files
class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.data: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.data.append(data)


# The viewer's own markup; a tag outside it would be prompt text that escaped escaping.
VIEWER_TAGS = {"div", "span", "pre", "details", "summary", "ul", "li", "b", "h3", "table", "tr", "th", "td"}


@pytest.mark.parametrize("path", SHIPPED_PARQUETS + SHARED_PARQUETS, ids=lambda p: p.name)
def test_release_prompts_load_parse_and_render_escaped(path):
    tasks = load_tasks(path)
    assert tasks and len(tasks) == pq.read_metadata(path).num_rows
    for task in tasks:
        prompt = task.metadata["afm_prompt"]
        protocol.parse(prompt)  # instructions that mention tags: problems allowed, crashes not
        page = trajectory_html(prompt, profile=task.profile)
        parser = _Tags()
        parser.feed(page)
        assert parser.tags <= VIEWER_TAGS, (task.id, parser.tags - VIEWER_TAGS)
        assert "<script" not in page.lower()
        # The question survives rendering as text (whitespace aside: role blocks are stripped).
        assert " ".join(task.question.split()[:8]) in " ".join("".join(parser.data).split()), task.id


# --------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("profile", sorted(EXAMPLES))
def test_format_templates_follow_their_grammar(profile):
    assert protocol.validate(EXAMPLES[profile], profile) == []


def test_only_the_web_prompt_states_the_verification_rule():
    web = coa_system_prompt("web")
    assert "<web_search>" in web and "<crawl_page>" in web
    assert "<double_check>" in web and "1" in web and "4" in web and "<plan>" in web
    for profile in ("mhqa", "math", "code"):
        assert "double_check" not in coa_system_prompt(profile)
