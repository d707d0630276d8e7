"""Result files are committed and read on other machines: every path they hold is relative (to the
repository or the working folder a run was made from) or names its root ($COA_LAB_RUNS, ~, $TMPDIR),
never a machine's absolute path. coa_lab/paths.py writes them so (portable_path), and publish()
and save_figure pass every result through it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coa_lab.paths import PROJECT_ROOT, from_portable, portable_path, portable_paths, portable_text, runs_dir

# the same shape as tests/repo/test_notebooks_static.py's check: a `/` that starts a token, then a machine root
ABSOLUTE = re.compile(r"(?<![\w.$~:/-])/(work|home|tmp|root|Users|mnt|scratch)/")
RESULT_FILES = sorted(
    [*(PROJECT_ROOT / "docs" / "results").rglob("*.json"), *(PROJECT_ROOT / "docs" / "results").rglob("*.jsonl"),
     *(PROJECT_ROOT / "notebooks" / "figures").glob("*.json"),
     # the RL measurement's committed state; a LoRA adapter's own adapter_config.json is PEFT's (its base
     # model as the machine that trained it named it), not a result
     *(p for p in (PROJECT_ROOT / "benchmarks" / "state").rglob("*.json*") if p.name != "adapter_config.json")])


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_no_result_file_holds_an_absolute_machine_path(path):
    text = path.read_text()
    found = [text[max(m.start() - 40, 0):m.end() + 40] for m in ABSOLUTE.finditer(text)]
    assert not found, f"absolute paths (write them with coa_lab.paths.portable_path): {found[:3]}"


def test_a_path_is_written_relative_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    inside = PROJECT_ROOT / "runs" / "demo" / "sft" / "adapter"
    assert portable_path(inside) == "runs/demo/sft/adapter" and from_portable("runs/demo/sft/adapter") == inside
    run = tmp_path / "work" / "runs" / "r58" / "effect" / "confirm"
    assert portable_path(run, tmp_path / "work") == "runs/r58/effect/confirm"  # relative to the working folder
    assert from_portable("runs/r58/effect/confirm", tmp_path / "work") == run
    assert portable_path(runs_dir() / "bench" / "x.json") == "$COA_LAB_RUNS/bench/x.json"
    assert from_portable("$COA_LAB_RUNS/bench/x.json") == runs_dir() / "bench" / "x.json"
    assert portable_path(Path.home() / ".cache" / "m") == "~/.cache/m"
    assert from_portable("~/.cache/m") == Path.home() / ".cache" / "m"
    assert portable_path("runs/x") == "runs/x"  # relative already
    for p in (inside, run, tmp_path / "elsewhere", Path("/srv/lab/runs/x")):
        assert not Path(portable_path(p)).is_absolute()


def test_paths_inside_results_and_command_lines_are_rewritten_and_nothing_else():
    tmp = portable_path(Path("/tmp/qwen3b"))
    result = {"source": "gpu_validate.py --out /tmp/gv --model-dir /tmp/qwen3b --tokenizer .gpu/tokenizer",
              "adapter": str(PROJECT_ROOT / "runs" / "demo" / "sft" / "adapter"), "seeds": [0, 1], "score": 0.5,
              "keep": ["a/work/b", "$OUT/gv", "../x", "https://host/work/y", "1/2", "GFLOP/s", "/workshop"]}
    out = portable_paths(result)
    gv = portable_path(Path("/tmp/gv"))
    assert out["source"] == f"gpu_validate.py --out {gv} --model-dir {tmp} --tokenizer .gpu/tokenizer"
    assert out["adapter"] == "runs/demo/sft/adapter" and out["seeds"] == [0, 1] and out["score"] == 0.5
    assert out["keep"] == result["keep"]  # not machine paths: untouched
    assert not ABSOLUTE.search(json.dumps(out))
    text = json.dumps({"out": "/work/m57/runs/r58/effect/confirm"})
    assert portable_text(text, "/work/m57") == json.dumps({"out": "runs/r58/effect/confirm"})
