# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export DEBUG ?= 1

.PHONY: run test lint check migrations-check pytest integration browser bench demo-reset clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(VENV)/bin/python
	$(PIP) install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PIP) install -q -r requirements-dev.txt
	touch $(VENV)/.installed $@

## Start Sluice on its embedded default (SQLite, filesystem broker, simulated GPU nodes) at http://127.0.0.1:8000
run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start -f Procfile

## Lint, Django checks, migrations check and the test suite (SQLite, eager tasks)
test: $(VENV)/.installed-dev lint check migrations-check pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

check: $(VENV)/.installed-dev
	$(PY) manage.py check

migrations-check: $(VENV)/.installed-dev
	$(PY) manage.py makemigrations --check --dry-run

pytest: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -m "not integration" $(PYTEST_ARGS)

## Integration tests: real PostgreSQL, Redis, Celery worker, beat and agents (see .ci/run)
integration: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -m integration $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev
	$(PY) bench/engine.py
	$(PY) bench/dispatch.py

demo-reset:
	rm -rf var/

clean:
	rm -rf $(VENV) var staticfiles
