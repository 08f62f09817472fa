# The two commands of the README:  `make` (set up, then the main job)  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: all setup demo test lint bench

all: demo

# a virtual environment with the pinned CPU build of torch and lumen installed in editable mode
$(BIN)/lumen: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(BIN)/lumen

setup: $(BIN)/lumen

# the main job on its built-in default
demo: setup
	$(BIN)/lumen count gpt2
	$(BIN)/python -c "import torch, lumen; m = lumen.GPT.from_preset('baby-gpt'); print('forward ok, logits', tuple(m(torch.zeros(1, 16, dtype=torch.long))[0].shape))"

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check code tests bench

bench: setup
	$(BIN)/python bench/run_all.py
