# gpuloom — the two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help venv run test test-unit test-integration lint contract format bench migrate up clean kube

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "needs $(PYTHON) (Python 3.11+)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install gpuloom with its dev tools

run: $(STAMP) ## start the whole stack (NATS, SQLite, every service, two simulated nodes)
	$(PY) -m gpuloom.devstack

test: $(STAMP) ## the full test suite, against real NATS JetStream and a real database
	$(PY) -m pytest -q

test-unit: $(STAMP) ## the fast unit tests only
	$(PY) -m pytest -q tests/unit

test-integration: $(STAMP) ## the integration tests (real NATS, database, service processes)
	$(PY) -m pytest -q tests/integration

lint: $(STAMP) ## ruff and mypy
	$(VENV)/bin/ruff check libs services tests bench migrations
	$(VENV)/bin/ruff format --check libs services tests bench migrations
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

contract: $(STAMP) ## write contracts/events.json, the published event schemas (after an additive change)
	$(PY) -c 'import sys; from gpuloom.events.contract import dump; sys.stdout.write(dump())' > contracts/events.json

format: $(STAMP) ## format the code
	$(VENV)/bin/ruff check --fix libs services tests bench migrations
	$(VENV)/bin/ruff format libs services tests bench migrations

bench: $(STAMP) ## the benchmarks of docs/benchmarks.md
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) bench/e2e_throughput.py
	$(PY) bench/e2e_throughput.py --scenario started
	$(PY) bench/queue_replay.py
	$(PY) bench/nats_sync.py
	$(PY) bench/restart_catchup.py
	$(PY) bench/job_listing.py
	$(PY) bench/explain_cost.py
	$(PY) bench/topology_domains.py --jobs 1500 --gap 1
	$(PY) bench/maintenance_window.py
	$(PY) bench/topology_replay.py
	$(PY) bench/topology_trace.py

migrate: $(STAMP) ## migrate GPULOOM_DATABASE_URL (default .gpuloom/gpuloom.db) to the latest schema
	$(PY) -m gpuloom.store.migrate

up: ## run the stack in Docker (needs a Docker engine)
	docker compose up --build

kube: ## build a real Kubernetes v1.20.2 (control plane and kubelet, from Debian's source package) into ~/.cache/gpuloom
	bash tools/kubernetes/build.sh
	bash tools/kubernetes/kubelet.sh

clean: ## remove the local data (.gpuloom: log, database, job logs)
	rm -rf .gpuloom
