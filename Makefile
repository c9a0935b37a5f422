# The two set-up commands of the README: `make example` and `make test`.
# Both create .venv from this project's own files the first time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,lint,docs]"
	touch $@

.PHONY: example test lint docs bench bench-web bench-peers faults chaos soak extras long
# `make example DASHBOARD=1`: afterwards, keep the dashboard running on the run's data.
example: $(BIN)/.installed
	$(BIN)/python -m example_project $(if $(DASHBOARD),--dashboard)

# Three pytest workers (pytest-xdist), each test file in one of them: the suite mostly waits on
# processes and servers, so three on two cores take 8:40 where two took 10:49 (4,919 tests).
test: lint
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --durations=20

lint: $(BIN)/.installed
	$(BIN)/ruff check celery_outbox tests example_project examples bench
	$(BIN)/mypy celery_outbox
	$(BIN)/lint-imports --no-cache

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, anchor or
# API reference fails the build. `.venv/bin/mkdocs serve` serves it while you write.
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(BIN)/.installed
	$(BIN)/python -m bench

# The outbox beside plain Celery, pgqueuer and procrastinate (bench/README.md, "Peers"). The
# peers and profilers are bench-only (bench/requirements.txt), never the package's dependencies.
bench-peers: $(BIN)/.installed
	$(BIN)/pip install -q -r bench/requirements.txt
	$(BIN)/python -m bench peers

# Hung servers (tests/faults.py) with every push kind, more rounds of the push_many race, and
# the fault matrix with more of its paths on PostgreSQL, eight CPU hogs for the gevent pool.
faults: $(BIN)/.installed
	OUTBOX_TEST_FAULTS=full OUTBOX_TEST_DEADLOCK_ROUNDS=30 $(BIN)/python -m pytest -q \
		tests/integration/test_hung_database.py tests/integration/test_hung_broker.py \
		tests/e2e/test_hung_database.py tests/integration/test_push_many_order.py \
		tests/matrix tests/e2e/test_many_ids_pools.py

# The chaos run, longer than the default suite's bounded one: EXECUTIONS, SEED, MINUTES.
EXECUTIONS ?= 2000
SEED ?= 1
MINUTES ?= 5
chaos: $(BIN)/.installed
	$(BIN)/python -m tests.chaos --executions $(EXECUTIONS) --seed $(SEED) --minutes $(MINUTES)

# The dashboard's reads at 1,000,000 rows on PostgreSQL (bench/README.md, "Dashboard").
bench-web: $(BIN)/.installed
	$(BIN)/python -m bench web

# The model tests with fresh random seeds for MINUTES minutes of wall time in all (shared by
# weight, tests/model/soak.py), then what they explored: make soak MINUTES=30 (MINUTES
# defaults to 5, as for chaos)
soak: $(BIN)/.installed
	OUTBOX_SOAK_STARTED=$$(date +%s.%N) OUTBOX_SOAK_MINUTES=$(MINUTES) CI=true \
		$(BIN)/python -m pytest tests/model -q -s -p no:logging

# The default suite with the variants it leaves out (tests/conftest.py `variants`): beat's
# RedBeat and django-celery-beat schedulers, warm shutdown on gevent and eventlet, a longer
# bounded chaos run, the limits e2e at full size (500 executions, 4 workers).
long: $(BIN)/.installed
	OUTBOX_TEST_LONG=1 $(BIN)/python -m pytest -q -n 3 --dist loadfile

# Every extra (core, redis, amqp, web, async, django) installed into a fresh venv of its own,
# then a real worker from that venv runs a job (`make test` runs core and redis only).
extras: $(BIN)/.installed
	OUTBOX_TEST_EXTRAS=all $(BIN)/python -m pytest -q tests/install
