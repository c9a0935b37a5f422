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

.PHONY: example test lint bench bench-web
# `make example DASHBOARD=1`: afterwards, keep the dashboard running on the run's data.
example: $(BIN)/.installed
	$(BIN)/python -m example_project $(if $(DASHBOARD),--dashboard)

test: lint
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check celery_outbox tests example_project bench
	$(BIN)/mypy celery_outbox
	$(BIN)/lint-imports --no-cache

bench: $(BIN)/.installed
	$(BIN)/python -m bench

# The dashboard's reads at 1,000,000 rows on PostgreSQL (bench/README.md, "Dashboard").
bench-web: $(BIN)/.installed
	$(BIN)/python -m bench web
