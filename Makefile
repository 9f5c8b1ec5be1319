# dledger-py: every target creates the venv it needs, so a clean clone works.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard proto/*/v1/*.proto)

.PHONY: install test test-long conformance soak chaos demo bench bench-storage bench-core proto lint format clean check-java

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dledger-py needs Python >= 3.11")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,spark,console]'
	@touch $(STAMP)

install: $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is required for Spark (the audit): install openjdk-17-jre-headless"; exit 1; }

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow and not conformance and not long"

# The whole chaos, power-cut and rolling-upgrade runs, and four leader-kill, rotation and membership runs of 20-30 s
# (tests marked ``long``, about three minutes): run by CI after make test, which stays under ten minutes on a
# 2-core machine without them.
test-long: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "long and not slow and not conformance"

# The official RocketMQ 5 clients, Python (PyPI) and Node.js (npm, installed into .cache/npm at the first run),
# against a plain and a secure group: what their own live tests expect of a server (tests/conformance/, a few
# minutes; the Node.js tests are skipped where node is not installed, .ci/run installs it).
conformance: $(STAMP)
	$(BIN)/python -m pytest -q -m conformance tests/conformance

soak: $(STAMP)
	SOAK=1 $(BIN)/python -m pytest -q -m slow

# A long randomized fault-injection run (about 10 minutes): every fault kind, then the checkers and the Spark audit.
CHAOS_S ?= 600
chaos: $(STAMP) check-java
	$(BIN)/python -m dledger chaos --out var/chaos/$$(date +%Y%m%d-%H%M%S) --faults all --duration $(CHAOS_S)

demo: $(STAMP) check-java
	$(BIN)/python -m dledger demo

bench: bench-storage bench-core

bench-storage: $(STAMP)
	$(BIN)/python -m bench.storage

bench-core: $(STAMP)
	$(BIN)/python -m bench.core

proto: $(STAMP)
	$(BIN)/python -m dledger.protogen

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy  # --strict on the files [tool.mypy] in pyproject.toml lists (tests/test_types.py runs it in make test)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

.PHONY: bench-replication bench-statemachine bench-broker bench-rocketmq bench-delivery bench-audit bench-retention
bench-replication: $(STAMP)
	$(BIN)/python -m bench.replication

bench-statemachine: $(STAMP)
	$(BIN)/python -m bench.statemachine

bench-broker: $(STAMP)
	$(BIN)/python -m bench.broker

# Produce with and without a retention policy that deletes as it goes (docs/broker.md, Retention).
bench-retention: $(STAMP)
	$(BIN)/python -m bench.retention

# A query by key through the key index: the index alone (1M messages), then a real group (docs/broker.md).
# make bench-keyindex KEYINDEX_ARGS="--group-messages 1000000 --compare"
.PHONY: bench-keyindex
bench-keyindex: $(STAMP)
	$(BIN)/python -m bench.keyindex $(KEYINDEX_ARGS)

# The blocking clients shared by 64 threads against the async clients with 64 tasks, on one broker group.
.PHONY: bench-cluster
bench-cluster: $(STAMP)
	$(BIN)/python -m bench.cluster_scale

.PHONY: bench-clients
bench-clients: $(STAMP)
	$(BIN)/python -m bench.clients

.PHONY: bench-cpu
bench-cpu: $(STAMP)
	$(BIN)/python -m bench.cpu_per_message

# The broker's own Python work per message, step by step, in one process (docs/send-budget.md): for comparing two
# revisions on a loaded machine (CPU time, not wall time).
.PHONY: bench-broker-path
bench-broker-path: $(STAMP)
	$(BIN)/python -m bench.broker_path

# Where one sequential write's time goes, hop by hop across the client and the three nodes (docs/send-budget.md):
# make bench-timeline TIMELINE_ARGS="--batch 256 --sends 300"
.PHONY: bench-timeline
bench-timeline: $(STAMP)
	$(BIN)/python -m bench.timeline $(TIMELINE_ARGS)

# Both followers' fdatasync stalled at once: a leader stepping down after one check-quorum period against two
# (docs/raft.md, "Check-quorum"): make bench-disk-stall DISK_STALL_ARGS="--stall-ms 400"
.PHONY: bench-disk-stall
bench-disk-stall: $(STAMP)
	$(BIN)/python -m bench.disk_stall $(DISK_STALL_ARGS)

# 1 topic against 10,000, an empty log against 10 million messages: send rate, restart, memory (docs/broker.md).
# make bench-scale SCALE_ARGS=--quick
.PHONY: bench-scale
bench-scale: $(STAMP)
	$(BIN)/python -m bench.scale $(SCALE_ARGS)

.PHONY: bench-security
bench-security: $(STAMP)
	$(BIN)/python -m bench.security

# The official RocketMQ 5 client against ours, on one broker group.
bench-rocketmq: $(STAMP)
	$(BIN)/python -m bench.rocketmq_client

bench-delivery: $(STAMP)
	$(BIN)/python -m bench.delivery

bench-audit: $(STAMP) check-java
	$(BIN)/python -m bench.audit

.PHONY: bench-spark
bench-spark: $(STAMP) check-java
	$(BIN)/python -m bench.spark_source

# Side by side with etcd (apt-get installs Debian's etcd-server when it can) and PySyncObj: a few minutes.
# make bench-compare COMPARE_ARGS=--quick
.PHONY: bench-compare
$(VENV)/.bench-installed: $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[test,bench,console]'
	@touch $@

bench-compare: $(VENV)/.bench-installed
	$(BIN)/python -m bench.compare $(COMPARE_ARGS)

# Our broker (flush sync and async) against NATS JetStream (apt-get installs Debian's nats-server when it can): a few minutes.
# make bench-broker-nats JETSTREAM_ARGS=--quick
.PHONY: bench-broker-nats
bench-broker-nats: $(VENV)/.bench-installed
	$(BIN)/python -m bench.jetstream $(JETSTREAM_ARGS)
