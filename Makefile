# The two set-up commands of the README: `make example` and `make test`.
# Both create .venv from this project's own files the first time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,lint]"
	touch $@

.PHONY: example test lint bench soak
example: $(BIN)/.installed
	$(BIN)/python -m example_project

test: lint
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check celery_outbox tests example_project bench
	$(BIN)/mypy celery_outbox
	$(BIN)/lint-imports --no-cache

bench: $(BIN)/.installed
	$(BIN)/python -m bench

# The model test with fresh random seeds for MINUTES minutes (half per database), then what it
# explored: make soak MINUTES=30
MINUTES ?= 10
soak: $(BIN)/.installed
	OUTBOX_SOAK_MINUTES=$(MINUTES) CI=true $(BIN)/python -m pytest tests/model -q -s -p no:logging
