"""Arms as --set-style overrides: parsed, checked against the preset before any work, and a
mistake named in one line (exit 2)."""

from __future__ import annotations

import pytest

from coa_lab.cli import main
from coa_lab.config import get_preset
from coa_lab.rl_arms import spec


def test_arms_parse_builtins_and_overrides():
    assert spec.parse_arm("control") == ("control", {"rl": {"pg_coef": 0.0, "sft_coef": 1.0}})
    assert spec.parse_arm("rft") == ("rft", {"rl": {"advantage": "rft", "sft_coef": 0.0}})
    assert spec.parse_arm("kl=rl.kl_coef=0.05,rl.sft_coef=0") == ("kl", {"rl": {"kl_coef": 0.05, "sft_coef": 0}})
    # a JSON value keeps its commas: the split is only before the next SECTION.FIELD=
    assert spec.parse_arm('p=rl.pool={"math/arith": 4, "mhqa/lookup": 2},rl.steps=3') == (
        "p", {"rl": {"pool": {"math/arith": 4, "mhqa/lookup": 2}, "steps": 3}})
    assert spec.parse_arm("same=")[1] == {}
    assert spec.parse_adapters(["control@2=/a", "kl=/b"]) == {("control", 2): "/a", ("kl", 0): "/b"}


@pytest.mark.parametrize("bad, message", [("ppo", "unknown arm 'ppo'"), ("sft", "not 'sft'"),
                                          ("a/b=rl.steps=1", "bad arm name"), ("x=steps=1", "section.field=value")])
def test_bad_arms_are_named(bad, message):
    with pytest.raises(SystemExit, match=message):
        spec.parse_arm(bad)


def test_unknown_field_is_refused_before_work(tmp_path, capsys, monkeypatch):
    from coa_lab import pipeline

    monkeypatch.setattr(pipeline, "draw_tasks", lambda *a, **k: pytest.fail("work began"))
    (tmp_path / "sft" / "adapter").mkdir(parents=True)
    (tmp_path / "sft" / "adapter" / "adapter_config.json").write_text("{}")
    assert main(["arms", "--run", str(tmp_path), "--preset", "cpu-smoke", "--arm", "x=rl.kl_coeff=0.1"]) == 2
    err = capsys.readouterr().err
    assert "arm 'x'" in err and "kl_coeff" in err and "fields:" in err
    assert main(["arms", "--run", str(tmp_path), "--preset", "cpu-smoke", "--arm", "x=rll.steps=1"]) == 2
    assert "no section 'rll'" in capsys.readouterr().err
    assert main(["arms", "--run", str(tmp_path), "--preset", "cpu-smoke", "--arm", "ppo"]) == 2
    assert "unknown arm 'ppo'" in capsys.readouterr().err
    # the control is the SFT mix alone: cpu-smoke has none (rl.sft_coef = 0)
    assert main(["arms", "--run", str(tmp_path), "--preset", "cpu-smoke", "--arm", "control"]) == 2
    assert "rl.sft_coef > 0" in capsys.readouterr().err


def test_layered_settings_and_help(capsys):
    base = get_preset("cpu-smoke", rl={"sft_coef": 1.0})
    p = spec.arm_preset(base, "kl", {"rl": {"kl_coef": 0.1}}, seed=3)
    assert (p.rl.kl_coef, p.rl.sft_coef, p.rl.seed, p.name) == (0.1, 1.0, 3, "cpu-smoke")
    with pytest.raises(SystemExit):
        main(["arms", "--help"])
    out = capsys.readouterr().out
    assert "--readout-only" in out and "NAME=SECTION.FIELD=VALUE" in out and "rl.temperature" in out


@pytest.mark.parametrize("recipe_mix", [0.0, 1.0])
def test_builtin_arms_mean_the_same_whatever_the_recipes_sft_mix(recipe_mix):
    """The recipe may drop the SFT mix (docs/rl-effect.md's rule): rl+ptx still mixes it in, rl and rft
    still leave it out, and the control still has an SFT loss to train on."""
    base = get_preset("cpu-tiny", rl={"sft_coef": recipe_mix})
    arm = {name: spec.arm_preset(base, name, spec.parse_arm(name)[1]).rl for name in spec.BUILTIN}
    assert arm["rl+ptx"].sft_coef == 1.0 and arm["rl+ptx"].pg_coef == 1.0
    assert arm["rl"].sft_coef == 0.0 and arm["rft"].sft_coef == 0.0 and arm["rft"].advantage == "rft"
    assert arm["control"].pg_coef == 0.0 and arm["control"].sft_coef == 1.0
