"""coa_lab/throughput.py: what a stage generated, and the report's stage table giving it as rollouts/s and
tokens/s (run_coa's count: tests/core/test_student_rollout.py)."""

from __future__ import annotations

import json

from coa_lab import throughput


def test_since_counts_only_what_came_after_the_mark_and_gives_rates():
    before = throughput.mark()
    throughput.count(4, 100)
    middle = throughput.mark()
    throughput.count(2, 60)
    assert throughput.since(before, 10.0) == {"rollouts": 6, "tokens": 160, "rollouts_per_s": 0.6,
                                              "tokens_per_s": 16.0}
    assert throughput.since(middle) == {"rollouts": 2, "tokens": 60}  # no time: no rates
    assert throughput.rates({"rollouts": 1, "tokens": 5}, 0.0) == {"rollouts": 1, "tokens": 5}


def test_the_report_gives_each_stage_its_rollouts_and_tokens_per_second(tmp_path):
    from coa_lab.report import write_report

    for stage, summary in {
        "capture": {"runs": 4, "activations": 20, "tool_calls": 4, "teacher": "t", "seconds": 10.0,
                    "generated": {"rollouts": 4, "tokens": 500, "rollouts_per_s": 0.4, "tokens_per_s": 50.0}},
        "sft": {"examples": 3, "first_loss": 1.0, "last_loss": 0.5, "losses": [1.0, 0.5], "trained_tokens": 900,
                "masked_observation_tokens": 10, "seconds": 30.0},
        "eval": {"base": {"math/arith": {"tasks": 4, "accuracy": 0.0, "answered": 0.5, "format_valid": 0.0,
                                         "tokens_per_sample": 75.0, "tokens_per_success": None,
                                         "tool_calls_per_success": None}}, "seconds": 8.0,
                 "generated": {"rollouts": 16, "tokens": 1200, "rollouts_per_s": 2.0, "tokens_per_s": 150.0}},
    }.items():
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "summary.json").write_text(json.dumps(summary))
    text = write_report(tmp_path).read_text()
    assert "| stage | key figures | seconds | rollouts/s | tokens/s |" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["capture"].endswith("| 10.0 | 0.40 | 50 |")
    assert rows["sft"].endswith("| 30.0 | – | 30 trained |")  # SFT samples nothing: its tokens are trained ones
    assert rows["eval"].endswith("| 8.0 | 2.00 | 150 |")
