"""Result files a reader can trace: `docs/results/<name>.json`, committed with the code.

A figure the README, docs/results.md or a notebook quotes is a link into one of these files, e.g.
``[0.807](docs/results/rl_seeds.json "sft_test_accuracy")``: the text is the figure, the link
is the file (relative to the page that quotes it, as a code host resolves it: ``results/x.json``
from docs/results.md), the title is the key inside it (dots for nesting, integers for list items, a
trailing ``*100`` when the text shows a fraction as points or percent, ``*24`` when it shows an
accuracy on 24 tasks as a count). `check_figures` reads
every such link and says which ones the file does not back (tests/repo/test_published_figures.py
runs it), so no result figure is typed by hand. A file that only history quotes (a setting since
changed, a lever not adopted) moves to `docs/results/archive/`, where its links are checked alike.

Each file is written by the run or benchmark that measured it (`publish`), with the date, the
commit of the code and the machine probe beside the result, because a timing or an accuracy
means little without them.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
from pathlib import Path

from coa_lab.paths import PROJECT_ROOT, portable_paths

RESULTS_DIR = PROJECT_ROOT / "docs" / "results"
# [shown](docs/results/<file>.json "key") -- the key in the title so the link still opens the file;
# a notebook's figure data (notebooks/figures/<name>.json, coa_lab/viz/plots.save_figure: the date,
# commit and machine beside what it plots) is linked the same way, from a notebook as figures/<name>.json;
# a page under docs/ links results/<name>.json, the path a code host resolves from there; a
# superseded file, quoted only as history, lies in results/archive/ and is linked (and checked) there
# the shown text may hold one level of balanced brackets, as Markdown's link text may: a
# parametrized test id such as test_notebook_runs_in_smoke_mode[07_ablations.ipynb]
LINK = re.compile(r'\[((?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]\(((?:\.\./)*(?:docs/results(?:/archive)?|notebooks/figures|figures|results(?:/archive)?)/[\w.-]+\.json) "([^"\n]+)"\)')


def git_commit(root: Path = PROJECT_ROOT) -> str | None:
    """The checkout's commit, with `-dirty` when the tracked files differ from it; None outside git."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=root,
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def provenance(machine: dict) -> dict:
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(), "machine": machine}


def publish(name: str, result: dict, source: str, machine: dict, directory: Path | None = None) -> Path:
    """Write docs/results/<name>.json: the result's own keys, plus `source` (the command line a
    reader runs to measure it again) and `provenance` (date, commit, machine; the result's own
    when it carries one, as a benchmark's does). Paths in it are written relative (portable_paths):
    the file is committed and read on other machines."""
    directory = Path(directory or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    doc = portable_paths({"source": source, "provenance": result.get("provenance") or provenance(machine),
                          **{k: v for k, v in result.items() if k != "provenance"}})
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def figure(doc: dict, key: str):
    """The value at a dotted key: 'result.gains.0', with '*N' at the end to scale it: '*100' shows a
    fraction as points or percent, '*24' an accuracy on 24 tasks as the count of tasks solved;
    'len(data.losses)' is how many items the list (or dict) at the key holds: 130 losses logged
    are 130 optimizer steps."""
    counted = re.fullmatch(r"len\((.+)\)", key)
    if counted:
        value = figure(doc, counted.group(1))
        if not isinstance(value, (list, dict)):
            raise KeyError(f"{key}: len() of a value that is not a list or dict ({value!r})")
        return len(value)
    scale = 1.0
    scaled = re.fullmatch(r"(.+)\*(\d+)", key)
    if scaled:
        key, scale = scaled.group(1), float(scaled.group(2))
    value = doc
    for part in key.split("."):
        if isinstance(value, list):
            if not part.lstrip("-").isdigit():
                raise KeyError(f"{key}: {part!r} indexes a list")
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(f"{key}: no {part!r}")
    if scale != 1.0:
        if not isinstance(value, (int, float)):
            raise KeyError(f"{key}: *{scale:g} on a value that is not a number ({value!r})")
        value = value * scale
    return value


def _shown_number(text: str) -> tuple[float, int] | None:
    """(value, decimals it is rounded to): '**+4.7**' -> (4.7, 1); '1,572' -> (1572.0, 0);
    '2.7e-7' -> (2.7e-07, 8); None if the text is not a number."""
    t = text.replace("*", "").replace(",", "").replace("−", "-").strip()
    t = re.sub(r"\s*(%|points?|s|min|GiB)$", "", t)
    m = re.fullmatch(r"([+-]?\d+)(?:\.(\d+))?(?:e([+-]?\d+))?", t)
    if not m:
        return None
    decimals = len(m.group(2) or "") - int(m.group(3) or 0)  # 2.7e-7 is read to 8 decimals
    return float(t), decimals


def check_figures(text: str, base: Path = PROJECT_ROOT) -> tuple[int, list[str]]:
    """(links checked, problems), each link read from `base`, the folder of the page that quotes
    it (docs/ for docs/results.md): each linked figure must be the file's value at its key, as
    the text rounds it (0.807 backs 0.8071, not 0.81); a true/false as yes/no or true/false; any
    other value must be equal as text."""
    problems, docs, n = [], {}, 0
    for shown, rel, key in LINK.findall(text):
        n += 1
        path = (base / rel).resolve()
        if path not in docs:
            try:
                docs[path] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                problems.append(f"[{shown}]({rel}): cannot read the file ({e})")
                continue
        try:
            value = figure(docs[path], key)
        except (KeyError, IndexError) as e:
            problems.append(f"[{shown}]({rel} {key!r}): {e}")
            continue
        number = _shown_number(shown)
        if number is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            quoted, decimals = number
            if abs(quoted - value) > 0.5 * 10 ** -decimals + 1e-9:
                problems.append(f"[{shown}]({rel} {key!r}): the file says {value}")
        elif isinstance(value, bool):  # a JSON true/false, shown as yes/no or true/false
            if shown.replace("*", "").strip().lower() not in (("yes", "true") if value else ("no", "false")):
                problems.append(f"[{shown}]({rel} {key!r}): the file says {value}")
        elif shown.replace("*", "").strip() != str(value):
            problems.append(f"[{shown}]({rel} {key!r}): the file says {value!r}")
    return n, problems


_NUMBER = re.compile(r"^(\**)([+−-]?)(\d[\d,]*(?:\.\d+)?)(.*)$")


def _restated(shown: str, value) -> str | None:
    """`shown` rewritten to `value` in its own style (bold, sign, thousands commas, decimals, unit);
    None where the style cannot be kept (an exponent, a yes/no, a value that is not a number)."""
    m = _NUMBER.match(shown)
    if not m or not isinstance(value, (int, float)) or isinstance(value, bool) or "e" in m.group(4)[:1]:
        return None
    stars, sign, digits, rest = m.groups()
    decimals = len(digits.partition(".")[2])
    text = f"{abs(value):{',' if ',' in digits else ''}.{decimals}f}"
    minus = "-" if sign == "-" else "−"  # the page's own minus where it showed one, else the typographic one
    lead = (minus if round(value, decimals) < 0 else "+" if sign else "")
    return f"{stars}{lead}{text}{rest}"


def refresh_figures(text: str, result: str, base: Path = PROJECT_ROOT) -> tuple[str, list[str]]:
    """`text` with every figure linked into the result file `result` (its name, e.g. demo_cpu-quick.json)
    restated from the file as it is now, in the style it was shown; (new text, what could not be restated).
    Why: a re-published run moves dozens of figures, and none may be typed by hand."""
    docs: dict[Path, dict] = {}
    left: list[str] = []

    def one(m: re.Match) -> str:
        shown, rel, key = m.groups()
        if Path(rel).name != result:
            return m.group(0)
        path = (base / rel).resolve()
        doc = docs.setdefault(path, json.loads(path.read_text()))
        try:
            new = _restated(shown, figure(doc, key))
        except (KeyError, IndexError) as e:
            left.append(f"[{shown}]({rel} {key!r}): {e}")
            return m.group(0)
        if new is None:
            left.append(f"[{shown}]({rel} {key!r}): not restated")
            return m.group(0)
        return m.group(0).replace(f"[{shown}]", f"[{new}]", 1)

    return LINK.sub(one, text), left


def refresh_page(page: Path, result: str) -> list[str]:
    """Restate in place the figures `page` links into `result`: a Markdown page whole, a notebook in its
    markdown cells only (its code is never touched); what could not be restated. Why a notebook too: a
    lesson's full run (COA_LAB_REFERENCE_FIGURES=1) rewrites notebooks/figures/*.json under its text."""
    raw = page.read_text()
    if page.suffix != ".ipynb":
        new, left = refresh_figures(raw, result, page.resolve().parent)
        page.write_text(new)
        return left
    notebook, left = json.loads(raw), []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            new, missed = refresh_figures("".join(cell["source"]), result, page.resolve().parent)
            cell["source"], left = new.splitlines(keepends=True), left + missed
    # nbformat's own layout (indent 1, unicode kept), so the diff shows only the restated figures
    page.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + ("\n" if raw.endswith("\n") else ""))
    return left


if __name__ == "__main__":  # python -m coa_lab.published 05_cost.json notebooks/05_evaluation.ipynb README.md ...
    import sys

    name, pages = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    for page in pages:
        for problem in refresh_page(page, name):
            print(f"{page}: {problem}")
        print(f"{page}: figures from {name} restated")
