# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export DEBUG ?= 1

.PHONY: run test lint check migrations-check docs pytest integration browser bench bench-api bench-e2e bench-reports bench-agent bench-slurm bench-million native demo-reset clean

# The interpreter .venv is made with: the Python 3.11 on the PATH built for speed, where
# there is one (tools/pick_python.py; `make PYTHON=python3 ...` to choose another). Worked
# out only when .venv is made, and once (the recipe keeps it in a shell variable).
PYTHON ?= $(shell python3 tools/pick_python.py 2>/dev/null || echo python3)

$(VENV)/bin/python:
	@py="$(PYTHON)"; echo "making $(VENV) with $$py"; \
	$$py -m venv $(VENV) || { rm -rf $(VENV); echo "falling back to python3"; python3 -m venv $(VENV); }
	$(PIP) install -q --upgrade pip

# `pip install -e .` installs the package itself: the `sluice` command-line client (sluice_cli).
# LDAP sign-in's python-ldap builds from source: installed where it builds, else one line says
# what to install (everything else works without it).
LDAP_INSTALL = $(PIP) install -q -r requirements-ldap.txt > build/ldap-install.log 2>&1 \
	|| echo "LDAP sign-in not installed (python-ldap needs libldap2-dev and libsasl2-dev: apt-get install libldap2-dev libsasl2-dev, then touch requirements-ldap.txt and make again); see build/ldap-install.log"

$(VENV)/.installed: requirements.txt requirements-ldap.txt pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -r requirements.txt
	@mkdir -p build; $(LDAP_INSTALL)
	$(PIP) install -q --no-deps -e .
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-ldap.txt requirements-dev.txt pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -r requirements-dev.txt
	@mkdir -p build; $(LDAP_INSTALL)
	$(PIP) install -q --no-deps -e .
	touch $(VENV)/.installed $@

## Start Sluice on its embedded default (SQLite, filesystem broker, simulated GPU nodes) at http://127.0.0.1:8000
## The engine (and job wrapper) compiled first where a C compiler is found: `make native`.
run: $(VENV)/.installed
	@if command -v $(CC) >/dev/null 2>&1; then $(MAKE) --no-print-directory native || \
	echo "make native failed: the scheduling engine runs as pure Python"; \
	else echo "no C compiler ($(CC)): the scheduling engine runs as pure Python (trace replays" \
	"about 2x slower); install one (apt-get install gcc python3-dev), then make native"; fi
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py seed_service_demo
	@$(PY) tools/preflight.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start -f Procfile

## Lint, Django checks, migrations check and the test suite (SQLite, eager tasks)
test: $(VENV)/.installed-dev lint check migrations-check docs pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## The scheduling engine compiled with mypyc (about a third faster; see scheduling/engine/native.py).
## Rebuilt when its sources change; without a C compiler the engine runs as pure Python.
ENGINE_SOURCES := $(wildcard scheduling/engine/*.py)
native: scheduling/engine/native.stamp scheduling/agent/sluice-job-wrapper

## The job wrapper compiled (scheduling/agent/wrapper.c); without a C compiler the agent
## starts wrapper.py instead (about 30 ms of CPU more per job).
CC ?= cc
scheduling/agent/sluice-job-wrapper: scheduling/agent/wrapper.c
	@mkdir -p build
	@if $(CC) -O2 -Wall -Wextra -o $@.tmp $< > build/wrapper.log 2>&1 && mv $@.tmp $@; then \
	echo "job wrapper compiled: $@"; \
	else cat build/wrapper.log; rm -f $@.tmp; echo "job wrapper NOT compiled: the agent starts wrapper.py"; fi

scheduling/engine/native.stamp: $(ENGINE_SOURCES) tools/build_native.py $(VENV)/.installed-dev
	@mkdir -p build
	@if $(PY) tools/build_native.py > build/native.log 2>&1; then tail -1 build/native.log; \
	else tail -20 build/native.log; echo "engine NOT compiled (see build/native.log): it runs as pure Python"; fi

## The manual (docs/, mkdocs.yml) built into site/; strict: a broken link fails
docs: $(VENV)/.installed-dev
	$(VENV)/bin/mkdocs build --strict --quiet

check: $(VENV)/.installed-dev
	$(PY) manage.py check

migrations-check: $(VENV)/.installed-dev
	$(PY) manage.py makemigrations --check --dry-run

pytest: $(VENV)/.installed-dev native
	$(VENV)/bin/pytest -m "not integration" $(PYTEST_ARGS)

## Integration tests: real PostgreSQL, Redis, Celery worker, beat and agents (see .ci/run)
integration: $(VENV)/.installed-dev native
	$(VENV)/bin/pytest -m integration $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev native
	$(PY) bench/engine.py
	$(PY) bench/dispatch.py

## The job API's cost per call in the web process: CPU ms and queries of POST one
## job, POST a bulk of 100, GET the list's default page and GET one job (DATABASE_URL or SQLite)
bench-api: $(VENV)/.installed-dev
	$(PY) bench/api.py $(ARGS)

## End to end: real web, workers and 4 agents × 8 simulated GPUs on PostgreSQL + Redis
## when both answer, else embedded. ARGS: --backend embedded, --big (10,000 jobs), --skip FIGURE
bench-e2e: $(VENV)/.installed-dev native
	$(PY) bench/e2e.py $(ARGS)

## A fleet of simulated nodes against the real control plane on PostgreSQL + Redis (1,000 nodes
## × 8 GPUs, 10,000 jobs by default; minutes): CPU per heartbeat and report, dispatch cycle
## p50/p99, report lag, /metrics and rollup times, database growth. ARGS: see --help
bench-fleet: $(VENV)/.installed-dev native
	nice -n 5 $(PY) bench/fleet.py $(ARGS)

## The job list page, the queue pages and GET /api/v1/jobs with 1,000,000 jobs (and ~4 million
## events) in PostgreSQL at 127.0.0.1:5432: p50/p95 per route as the platform admin and a
## tenant member, MB per 100,000 jobs (scratch database, ~8 min on 2 cores). ARGS: see --help
bench-million: $(VENV)/.installed-dev
	$(PY) bench/million.py $(ARGS)

## Agent reports: CPU and queries per job of started/exited batches of 1, 8 and 50,
## in process; on PostgreSQL beside DATABASE_URL's when it names one, else SQLite. ARGS: see --help
bench-reports: $(VENV)/.installed-dev
	$(PY) bench/reports.py $(ARGS)

## The node agent: its own CPU and its jobs' processes per job running `true` on
## 8 simulated GPUs, in process (no broker, no Django), and state files written per job
bench-agent: $(VENV)/.installed-dev native
	$(PY) bench/agent.py $(ARGS)

## A Slurm pool against Slurm itself (docs/benchmarks.md): 1,000 one-GPU jobs straight to an emulated
## cluster of 4 × 8 GPUs and the same through Sluice, in the same run; idle submit→RUNNING of each.
## Needs root, Slurm, munge, PostgreSQL and Redis. ARGS: --rounds N, --jobs N, --idle N
bench-slurm: $(VENV)/.installed-dev native
	nice $(PY) bench/slurm_drain.py $(ARGS)

## Remove what `make run` created: var/, and the job accounts and job folders its agents
## made (recorded in var/created.jsonl; as root: sudo make demo-reset). Stop `make run` first.
demo-reset:
	@python3 tools/demo_reset.py

clean:
	rm -rf $(VENV) var staticfiles site build scheduling/agent/sluice-job-wrapper scheduling/engine/*.so scheduling/engine/native.stamp sluice_engine__mypyc*.so
