"""environment.yml mirrors pyproject.toml, and the CPU path never imports GPU-only packages."""

import subprocess
import sys
import tomllib

from coa_lab.paths import PROJECT_ROOT


def _pins(lines):
    return {l.split("==")[0].strip(): l.split("==")[1].strip() for l in lines if "==" in l}


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    pyproject = _pins(project["dependencies"] + project["optional-dependencies"]["dev"])
    env = _pins(l.strip().lstrip("- ") for l in (PROJECT_ROOT / "environment.yml").read_text().splitlines()
                if not l.lstrip().startswith("#"))
    env.pop("torch")  # the CPU build is pinned exactly in the environment, a range in pyproject
    pyproject.pop("torch", None)
    assert env == pyproject


def test_gpu_packages_stay_in_the_gpu_extra():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    for pkg in ("unsloth", "vllm", "bitsandbytes", "trl", "liger-kernel"):  # trl: unsloth's dependency only
        assert pkg not in core and any(pkg in d for d in project["optional-dependencies"]["gpu"])


def test_cpu_path_imports_no_gpu_package():
    code = (
        "import sys\n"
        "import coa_lab.pipeline, coa_lab.training.sft, coa_lab.rl.trainer, coa_lab.evaluate, coa_lab.cli\n"
        "import coa_lab.generation.llm, coa_lab.generation.models\n"
        "import coa_lab.capture.teacher, coa_lab.distill.filters, coa_lab.tools.registry\n"
        "import coa_lab.viz.trajectory, coa_lab.viz.browser, coa_lab.viz.sft_mask, coa_lab.viz.plots\n"
        "import coa_lab.training.lm_head\n"
        "bad = [m for m in ('unsloth', 'vllm', 'bitsandbytes', 'trl', 'liger_kernel') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
