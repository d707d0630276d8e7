"""The `coa-lab` command line."""

import json
import subprocess
import sys

import pytest

from coa_lab.cli import main, parse_overrides


def test_parse_overrides_types():
    assert parse_overrides(["rl.steps=2", "model.name=Qwen/Qwen2.5-3B-Instruct", "gen.temperature=0.5"]) == {
        "rl": {"steps": 2}, "model": {"name": "Qwen/Qwen2.5-3B-Instruct"}, "gen": {"temperature": 0.5}}
    with pytest.raises(SystemExit, match="section.field=value"):
        parse_overrides(["steps=2"])


def test_unknown_field_is_a_clear_error(tmp_path, capsys):
    assert main(["rl", "--run", str(tmp_path), "--set", "rl.stepz=2"]) == 2
    assert "rl has no field" in capsys.readouterr().err


def test_stage_without_inputs_names_the_missing_file(tmp_path, capsys):
    assert main(["distill", "--run", str(tmp_path)]) == 2
    assert "traces.jsonl" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="traces.jsonl"):  # --debug: the exception itself
        main(["distill", "--run", str(tmp_path), "--debug"])


def test_control_before_rl_names_what_to_run_first(tmp_path, capsys):
    assert main(["control", "--run", str(tmp_path)]) == 2
    assert "run the sft and rl stages first" in capsys.readouterr().err
    assert not (tmp_path / "control").exists()


def test_exec_subcommand_prints_one_json_object(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("print(sum(range(10)))\n")
    out = subprocess.run([sys.executable, "-m", "coa_lab.cli", "exec", str(prog), "--timeout", "5"],
                         capture_output=True, text=True, timeout=60)
    result = json.loads(out.stdout)
    assert result["stdout"].strip() == "45" and result["exit_code"] == 0 and not result["timed_out"]


def test_help_lists_every_stage():
    out = subprocess.run([sys.executable, "-m", "coa_lab.cli", "--help"], capture_output=True, text=True, timeout=60)
    for stage in ("capture", "distill", "sft", "rl", "control", "eval", "demo", "exec"):
        assert stage in out.stdout


def test_data_inspect_and_gold_policy(capsys):
    assert main(["data", "inspect", "datasets/math/gsm8k/eval.jsonl"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k" in out and "200" in out
    assert main(["eval", "--policy", "gold", "--suite", "datasets/math/gsm8k/eval.jsonl"]) == 0
    assert "100" in capsys.readouterr().out


def test_eval_suite_rejects_a_folder_that_is_not_an_adapter(tmp_path, capsys):
    assert main(["eval", "--suite", "math/arith", "--adapter", str(tmp_path)]) == 2
    assert "not a LoRA adapter folder" in capsys.readouterr().err


def test_eval_suite_unknown_target_is_a_clear_error(capsys):
    assert main(["eval", "--suite", "math/nonesuch"]) == 2
    assert "no such file, folder or suite" in capsys.readouterr().err


@pytest.mark.model
def test_eval_any_model_on_any_task_file(tmp_path, capsys):
    # a task file the loaders read, outside datasets/: two look-ups in the plain QA layout
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "Who directed the film Casablanca?", "answer": "Michael Curtiz"}\n'
                  '{"question": "When was Marie Curie born?", "answer": "7 November 1867"}\n')
    assert main(["eval", "--suite", str(qa), "--set", "gen.max_new_tokens=16", "--set", "gen.max_turns=1"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "tok/success" in out and str(qa) in out
    row = next(line for line in out.splitlines() if line.startswith(str(qa)))
    assert row.split()[1] == "2"  # both tasks evaluated
    assert main(["eval", "--suite", "math/arith", "--limit", "2", "--set", "gen.max_new_tokens=16",
                 "--set", "gen.max_turns=1"]) == 0
    assert "math/arith/test.jsonl" in capsys.readouterr().out
