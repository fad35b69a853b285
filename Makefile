# lowtide — every target sets up .venv itself.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TYPECHECK := build/typecheck
SOURCES := lowtide operators punctuation clients server tests bench deploy setup.py

# Bytecode is cached even where the environment says not to: make test starts hundreds of
# interpreters (servers, their workers, the CLI), and each would compile lowtide from source.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup pyflink test quick lint unit nexmark test-explore faults demo bench clean

setup: $(STAMP)

# Reinstall only when the project's metadata changed: quick and idempotent otherwise.
$(STAMP): pyproject.toml setup.py proto/lowtide.proto
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench,ray]'
	touch $(STAMP)

# PyFlink, the oracle of tests/nexmark and a peer in bench/: its own interpreter, since apache-flink
# pins pyarrow, protobuf and apache-beam below what lowtide needs. Never a dependency of lowtide.
FLINK_VENV := .venv-pyflink
FLINK_STAMP := $(FLINK_VENV)/.installed
pyflink: $(FLINK_STAMP)

$(FLINK_STAMP):
	test -x $(FLINK_VENV)/bin/python || $(PY) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLINK_VENV)/bin/python -m pip install --quiet 'apache-flink>=2.1'
	touch $(FLINK_STAMP)

# mypy cannot follow setuptools' package-dir mapping through the editable finder,
# so it checks a tree of links laid out as the installed `lowtide` namespace.
$(TYPECHECK): FORCE
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/lowtide
	for f in lowtide/*; do ln -s $(CURDIR)/$$f $(TYPECHECK)/lowtide/; done
	for d in operators punctuation clients server proto; do ln -s $(CURDIR)/$$d $(TYPECHECK)/lowtide/$$d; done

lint: setup $(TYPECHECK)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy -p lowtide

unit: setup pyflink
	$(BIN)/pytest -q -rs -n 2 --dist loadgroup --durations=20 tests

# The loop while editing: the unit, property and fuzz tiers without real processes (no server,
# Spark, Ray or Flink), each property on a quarter of its examples. make test runs everything.
quick: setup
	LOWTIDE_QUICK=1 $(BIN)/pytest -q -rs -n 2 --dist loadgroup -m "not integration" tests/unit tests/property tests/fuzz

# Every Nexmark query lowtide and Flink both run, on more events (make test runs a few).
nexmark: setup pyflink
	NEXMARK_ALL=1 $(BIN)/pytest -q -rs -n 2 --dist loadgroup tests/nexmark

test: lint unit

# New hypothesis examples (not in CI; make test draws the same ones every run) from a seed that
# is printed first and again on a failure: make test-explore SEED=<n> draws them again.
SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
test-explore: setup
	@echo "test-explore: --hypothesis-seed=$(SEED)"
	$(BIN)/pytest -q -rs -n 2 --dist loadgroup -p no:cacheprovider --hypothesis-profile=explore \
		--hypothesis-seed=$(SEED) tests/unit tests/property tests/fuzz \
		|| { echo "test-explore: failed; again with make test-explore SEED=$(SEED)"; exit 1; }

# The randomized fault suite at length (make test runs its first 3 seeds).
FAULT_RUNS ?= 30
FAULT_SEED ?= 3
faults: setup
	$(BIN)/pytest -q -rs tests/integration/test_faults.py --fault-runs $(FAULT_RUNS) --fault-seed $(FAULT_SEED)

demo: setup
	$(BIN)/lowtide demo

bench: setup pyflink
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/windows.py
	$(BIN)/python bench/server_queries.py
	$(BIN)/python bench/disorder.py
	$(BIN)/python bench/skew.py
	$(BIN)/python bench/join.py
	$(BIN)/python bench/latency.py
	$(BIN)/python bench/adapt.py
	$(BIN)/python bench/sessions.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/nexmark.py

clean:
	rm -rf build $(VENV) $(FLINK_VENV) .pytest_cache .mypy_cache .ruff_cache

FORCE:
