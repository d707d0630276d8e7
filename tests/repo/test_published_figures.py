"""Every result figure the README, the pages under docs/ (docs/results.md above all) and the
notebooks quote is a link into a committed file under docs/results/ or, for a lesson's own full
run, notebooks/figures/ (coa_lab/published.py), and the file backs it: no figure is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coa_lab.paths import PROJECT_ROOT
from coa_lab.published import LINK, RESULTS_DIR, check_figures, figure, publish

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("*.ipynb"))
README = PROJECT_ROOT / "README.md"
RESULTS_PAGE = PROJECT_ROOT / "docs" / "results.md"  # the results narrative; the README keeps the headline table
HISTORY_PAGE = PROJECT_ROOT / "docs" / "history.md"  # how the decisions of docs/design.md came to be
ARCHIVE_DIR = RESULTS_DIR / "archive"  # superseded result files, quoted as history
DOC_PAGES = sorted((PROJECT_ROOT / "docs").glob("*.md"))


def test_a_figure_is_checked_against_its_file(tmp_path):
    results = tmp_path / "docs" / "results"
    publish("x", {"acc": [0.8071, 0.75], "gain": 0.047, "name": "cpu-tiny", "machine": {"cores": 2}},
            "benchmarks/bench_x.py", {"cores": 2}, results)
    ok = ('[0.807](docs/results/x.json "acc.0") [**0.81**](docs/results/x.json "acc.0") '
          '[+4.7 points](docs/results/x.json "gain*100") [cpu-tiny](docs/results/x.json "name")')
    assert check_figures(ok, tmp_path) == (4, [])
    n, problems = check_figures('[0.80](docs/results/x.json "acc.0") [0.75](docs/results/x.json "acc.2") '
                                '[1](docs/results/y.json "a") [tiny](docs/results/x.json "name")', tmp_path)
    assert n == 4 and len(problems) == 4  # wrong rounding, no such item, no such file, other text
    assert "0.8071" in problems[0]
    publish("b", {"same": True, "other": False, "machine": {"cores": 2}}, "benchmarks/bench_b.py", {"cores": 2}, results)
    assert check_figures('[yes](docs/results/b.json "same") [true](docs/results/b.json "same") '
                         '[no](docs/results/b.json "other") [false](docs/results/b.json "other")', tmp_path) == (4, [])
    n, problems = check_figures('[no](docs/results/b.json "same") [yes](docs/results/b.json "other") '
                                '[1](docs/results/b.json "same")', tmp_path)
    assert n == 3 and len(problems) == 3  # a boolean is never read as its opposite, nor as a number


def test_a_figure_may_show_a_parametrized_test_id(tmp_path):
    """The text of a link may hold balanced brackets (a test id such as name[07_ablations.ipynb]);
    an unmatched bracket before a link does not swallow it."""
    from coa_lab.published import check_figures

    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "t.json").write_text(json.dumps({"slow": ["tests/a.py::t[07.ipynb]"], "n": 3}))
    ok = '[tests/a.py::t[07.ipynb]](docs/results/t.json "slow.0") and a [ bracket then [3](docs/results/t.json "n")'
    assert check_figures(ok, tmp_path) == (2, [])
    bad = '[tests/a.py::t[08.ipynb]](docs/results/t.json "slow.0")'
    assert check_figures(bad, tmp_path)[1]


def test_a_page_under_docs_links_its_figures_as_a_code_host_resolves_them(tmp_path):
    """docs/results.md links results/x.json, the path GitHub opens from docs/; checked from the
    page's own folder, that link reads the file, and a root-relative docs/results/x.json there (a
    link that would 404 on the code host) does not, nor does results/x.json from the README."""
    results = tmp_path / "docs" / "results"
    publish("x", {"acc": 0.8071}, "src", {"cores": 2}, results)
    assert check_figures('[0.807](results/x.json "acc")', tmp_path / "docs") == (1, [])
    assert check_figures('[0.81](../docs/results/x.json "acc")', tmp_path / "docs") == (1, [])
    n, problems = check_figures('[0.807](docs/results/x.json "acc")', tmp_path / "docs")
    assert n == 1 and "cannot read the file" in problems[0]
    n, problems = check_figures('[0.807](results/x.json "acc")', tmp_path)  # the README's folder
    assert n == 1 and "cannot read the file" in problems[0]
    n, problems = check_figures('[0.80](results/x.json "acc")', tmp_path / "docs")
    assert n == 1 and "the file says 0.8071" in problems[0]


def test_a_superseded_file_is_linked_and_checked_in_the_archive(tmp_path):
    """A result file that only history quotes lies in docs/results/archive/: its links read the
    file there, from docs/ as from the README, and a link left at the old place reads nothing."""
    publish("old", {"gain": 0.047}, "src", {"cores": 2}, tmp_path / "docs" / "results" / "archive")
    assert check_figures('[+4.7](results/archive/old.json "gain*100")', tmp_path / "docs") == (1, [])
    assert check_figures('[+4.7](docs/results/archive/old.json "gain*100")', tmp_path) == (1, [])
    n, problems = check_figures('[+4.8](results/archive/old.json "gain*100")', tmp_path / "docs")
    assert n == 1 and "the file says 4.7" in problems[0]
    n, problems = check_figures('[+4.7](results/old.json "gain*100")', tmp_path / "docs")
    assert n == 1 and "cannot read the file" in problems[0]


def test_published_files_carry_their_provenance(tmp_path):
    doc = json.loads(publish("x", {"a": 1}, "src", {"fp32_gflops": 150.0}, tmp_path).read_text())
    assert doc["source"] == "src" and doc["provenance"]["machine"] == {"fp32_gflops": 150.0}
    assert doc["provenance"]["date"].startswith("20")
    assert figure(doc, "a") == 1
    with pytest.raises(KeyError):
        figure(doc, "a.b")


def test_a_count_of_tasks_is_an_accuracy_scaled_by_the_task_count(tmp_path):
    """'14 of 24' in a lesson's text: [14](... "rows.sft.accuracy*24"), checked like any figure."""
    publish("c", {"acc": 0.5833333333333334, "tasks": 24}, "src", {"cores": 2}, tmp_path / "docs" / "results")
    assert check_figures('[14](docs/results/c.json "acc*24") of [24](docs/results/c.json "tasks")', tmp_path) == (2, [])
    n, problems = check_figures('[13](docs/results/c.json "acc*24")', tmp_path)
    assert n == 1 and "the file says 14.0" in problems[0]  # 13 of 24 would be a different result


def test_a_count_of_steps_is_the_length_of_their_log(tmp_path):
    """'130 optimizer steps': [130](... "len(data.losses)"), one loss logged per step."""
    publish("s", {"data": {"losses": [2.0, 1.5, 1.2], "examples": 2}}, "src", {"cores": 2}, tmp_path / "docs" / "results")
    assert check_figures('[3](docs/results/s.json "len(data.losses)")', tmp_path) == (1, [])
    n, problems = check_figures('[4](docs/results/s.json "len(data.losses)")', tmp_path)
    assert n == 1 and "the file says 3" in problems[0]
    n, problems = check_figures('[2](docs/results/s.json "len(data.examples)")', tmp_path)  # not a list
    assert n == 1 and "len()" in problems[0]


@pytest.mark.parametrize("path", [README, *DOC_PAGES, *NOTEBOOKS], ids=lambda p: str(Path(p).relative_to(PROJECT_ROOT)))
def test_every_quoted_figure_matches_its_file(path):
    if path.suffix == ".ipynb":
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    n, problems = check_figures(text, path.parent)
    assert not problems, "\n".join(problems)
    if path == README:
        assert n >= 10  # the README's results are links, not typed figures
    elif path == RESULTS_PAGE:
        assert n >= 300  # the results narrative: every figure a link (about 600 today)
    elif path.name[:2] in ("02", "03", "04", "05", "07"):  # lessons whose text reports their full run's figures
        assert n >= 3, f"{path.name}: its measured figures are links into figures/*.json"


def _quoted(*pages: Path) -> set[Path]:
    """The result files the pages' figure links open, each resolved from its page's folder."""
    return {(page.parent / rel).resolve() for page in pages for _, rel, _ in LINK.findall(page.read_text())}


def test_every_results_file_says_what_produced_it_and_is_quoted():
    """A current file is quoted by the README or docs/results.md; an archived one (superseded,
    docs/results/archive/) by docs/results.md or docs/history.md, at its archive path."""
    files, archived = sorted(RESULTS_DIR.glob("*.json")), sorted(ARCHIVE_DIR.glob("*.json"))
    assert files and archived
    current_quotes, history_quotes = _quoted(README, RESULTS_PAGE), _quoted(RESULTS_PAGE, HISTORY_PAGE)
    expected = [(p, current_quotes, "the README or docs/results.md") for p in files]
    expected += [(p, history_quotes, "docs/results.md or docs/history.md") for p in archived]
    for path, quoted, where in expected:
        doc = json.loads(path.read_text())
        name = path.relative_to(RESULTS_DIR)
        assert doc["source"] and {"date", "commit", "machine"} <= doc["provenance"].keys(), name
        assert path.resolve() in quoted, f"{name} is committed but neither {where} quotes from it"


def test_every_results_path_named_in_prose_exists():
    """A result file named as a path (docs/results/x.json in a page, a docstring or a comment) is
    where the name says: a file moved to the archive leaves no mention at its old place."""
    import re

    sources = [README, *DOC_PAGES, *sorted((PROJECT_ROOT / "benchmarks").glob("*.py")),
               *sorted((PROJECT_ROOT / "coa_lab").rglob("*.py"))]
    named = 0
    for source in sources:
        for rel in re.findall(r"docs/results/(?:archive/)?[\w-]+\.(?:json|png)\b", source.read_text()):
            named += 1
            assert (PROJECT_ROOT / rel).exists(), f"{source.relative_to(PROJECT_ROOT)} names {rel}: no such file"
    assert named >= 20


def test_the_readme_keeps_the_headline_table_and_the_results_page_the_rest():
    """The README's results are a short headline table (the demo's accuracies, tokens per success,
    RL's own effect against its start and its controls, as intervals) that sends the reader to docs/results.md."""
    readme = README.read_text()
    assert len(readme.splitlines()) <= 210, "the README grew back: results go to docs/results.md"
    assert "(docs/results.md)" in readme
    headline = {(Path(rel).name, key) for _, rel, key in LINK.findall(readme)}
    for key in ("summary.base_accuracy", "summary.sft_accuracy", "summary.rl_accuracy", "summary.tokens_per_success_ratio"):
        assert ("demo_cpu-quick.json", key) in headline, key
    for key in ("val.arms.rl.greedy.ci95.0*100", "val.arms.rl.avg_at_4.ci95.0*100", "val.arms.control.greedy.ci95.0*100",
                "val.rl_minus_rft.greedy.ci95.0*100"):
        assert ("rl_effect.json", key) in headline, key
    page = RESULTS_PAGE.read_text()
    for section in ("## RL against its control", "## RL across seeds", "## Speed: where a CPU's time goes", "## Notes and limits"):
        assert section in page, section


def test_the_readme_and_the_results_page_link_only_to_what_exists():
    """Each relative link (a figure's file, a plot, a page, a #section) opens from the page's own
    folder, as a code host resolves it: text moved between the pages (the README and
    docs/results.md, docs/design.md and docs/history.md, a file moved to docs/results/archive/)
    keeps working links. Every page under docs/ is held to it."""
    import re

    def sections(page: Path) -> set[str]:  # GitHub's anchors: lower case, punctuation dropped, spaces as '-'
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}

    for page in (README, *DOC_PAGES):
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s\"]+)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            rel, _, section = target.partition("#")
            linked = (page.parent / rel).resolve() if rel else page
            assert linked.exists(), f"{page.name}: {target} opens nothing"
            if section and linked.suffix == ".md":
                assert section in sections(linked), f"{page.name}: {target} names no section"


def test_the_planner_figures_are_what_the_planner_computes_today():
    """docs/results/plan_gpu_3b_l4.json is the planner's output (benchmarks/bench_plan.py): a
    planner change that moves the README's one-GPU figures must republish it."""
    from conftest import import_benchmark

    published = json.loads((RESULTS_DIR / "plan_gpu_3b_l4.json").read_text())
    now = import_benchmark("bench_plan").plan()
    for section in ("memory_gib", "fits", "time"):
        assert published[section] == json.loads(json.dumps(now[section])), section


def test_a_republished_files_figures_are_restated_in_their_own_style(tmp_path):
    from coa_lab.published import refresh_figures

    results = tmp_path / "docs" / "results"
    publish("d", {"acc": 0.8, "gain": 0.031, "loss": -0.07, "secs": 2409, "name": "cpu-quick", "machine": {"cores": 2}},
            "coa-lab demo", {"cores": 2}, results)
    page = ('**[0.80](docs/results/d.json "acc")** [+3.1](docs/results/d.json "gain*100") '
            '[[−7.0](docs/results/d.json "loss*100")] [2,409](docs/results/d.json "secs") s '
            '[cpu-quick](docs/results/d.json "name") [0.5](docs/results/other.json "x")')
    publish("d", {"acc": 0.8342, "gain": -0.0125, "loss": 0.02, "secs": 3517.6, "name": "cpu-tiny",
                  "machine": {"cores": 2}}, "coa-lab demo", {"cores": 2}, results)
    new, left = refresh_figures(page, "d.json", tmp_path)
    assert new == ('**[0.83](docs/results/d.json "acc")** [−1.2](docs/results/d.json "gain*100") '
                   '[[+2.0](docs/results/d.json "loss*100")] [3,518](docs/results/d.json "secs") s '
                   '[cpu-quick](docs/results/d.json "name") [0.5](docs/results/other.json "x")')  # another file: left
    assert left == ['[cpu-quick](docs/results/d.json \'name\'): not restated']  # text is not restated: said so
    n, problems = check_figures(new.replace("[cpu-quick]", "[cpu-tiny]"), tmp_path)
    assert n == 6 and len(problems) == 1 and problems[0].startswith("[0.5](docs/results/other.json): cannot read")


def test_a_notebooks_figures_are_restated_in_its_markdown_only(tmp_path):
    """A lesson's full run rewrites notebooks/figures/*.json; its markdown cells follow, its code cells do not."""
    from coa_lab.published import refresh_page

    figures = tmp_path / "notebooks" / "figures"
    figures.mkdir(parents=True)
    (figures / "f.json").write_text(json.dumps({"data": {"acc": 0.4583}}))
    link = '[0.29](figures/f.json "data.acc")'
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [f"Accuracy {link}\n", "next line"]},
             {"cell_type": "code", "metadata": {}, "source": [f"# {link}"], "outputs": [], "execution_count": None}]
    page = tmp_path / "notebooks" / "n.ipynb"
    page.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n")
    assert refresh_page(page, "f.json") == []
    restated = json.loads(page.read_text())["cells"]
    assert restated[0]["source"] == ['Accuracy [0.46](figures/f.json "data.acc")\n', "next line"]
    assert restated[1]["source"] == [f"# {link}"]  # code is never rewritten
    assert check_figures("".join(restated[0]["source"]), page.parent) == (1, [])
