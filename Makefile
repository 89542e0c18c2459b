# torpor: make deps | make test | make demo | make bench | make install
SHELL := /bin/bash
VENV ?= $(or $(TORPOR_VENV),.venv)
PY := $(VENV)/bin/python
BUILD := build
PREFIX ?= /usr/local
# the fast tests' workers: one per core and one more, since many of them wait on a process they
# started (the C front end, a fake registry, a deadline) and the extra worker fills those waits
# (two cores: 8.1-8.6 s against 9.5-9.6 s with one per core); each test file on one worker, so a
# module's fixture (the compiled front end, a key) is made once, not once per worker
UNIT_WORKERS := $(shell echo $$(( $$(nproc) + 1 )))
# Plain asserts: every worker would otherwise rewrite every test module's asserts, and with
# PYTHONDONTWRITEBYTECODE set (as on CI) pytest never caches them: 1.3 s of the budget on two
# cores (8.5 s against 9.8 s from a fresh clone). A failure shows its line and message;
# `pytest tests/unit/test_x.py` shows the values as well.
UNIT := $(PY) -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist loadfile --assert=plain \
	tests/unit
# torpor's bytecode, written once before the workers start: with PYTHONDONTWRITEBYTECODE set, as
# on CI, each worker would otherwise compile every module it imports, every run
BYTECODE := $(PY) -c 'from torpor.runtime_config.launchers import precompile; precompile()'
# the suites on real components: one worker per core, at most four, each test file on one worker
# (its module's nodes, registry or cluster made once). Their tests mostly wait on the processes
# they started: on two cores the whole suite takes 11.9 min on two workers against 22.8 min on
# one. Each worker has its own world (tests/support/world.py): nodes, namespaces, subnets and
# ports are its own.
SUITE_WORKERS := $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
SUITE := $(PY) -m pytest -q -p no:cacheprovider -n $(SUITE_WORKERS) --dist loadfile

.PHONY: deps demo-deps venv test lint unit demo bench bench-lifecycle bench-checkpoint bench-image bench-registry bench-podman bench-fuzz install protos clean

# Everything the tests and the demo need: system packages, CRIU 4.2.1, the Python venv.
deps:
	@bash packaging/install-deps.sh

# What the demo and a system-wide install need: system packages, CRIU, the venv (no test tools).
demo-deps:
	@bash packaging/install-deps.sh --demo

# Only the Python environment (what `make unit` and `make lint` need).
venv:
	@bash packaging/install-deps.sh --python

# The core suite, which runs again on containerd 2.1 and 2.4 over runc 1.3 (the first run is
# Debian's containerd 1.6 and runc 1.1.5; the chains, in the first run, on 1.6, 2.1 and 2.4):
# about two minutes each on two cores. Restore on create: ctr on each, a pod's CRI on 2.1 and 2.4.
CORE_TESTS := tests/test_lifecycle.py tests/test_checkpoint_restore.py \
	tests/test_restore_on_create.py

# The whole suite: lint, types, the fast tests, then every test (real containerd, runc, CRIU,
# registry), then the core tests again on the other versions.
test: deps
	$(PY) -m ruff check torpor tests bench
	$(PY) -m mypy
	$(BYTECODE)
	$(UNIT)
	$(SUITE) --ignore=tests/unit
	$(SUITE) --containerd 2 --runc 1.3 $(CORE_TESTS)
	$(SUITE) --containerd 2.4 --runc 1.3 $(CORE_TESTS)

# The fast tests: every pure piece, nothing started, under 10 s.
unit: venv
	@$(BYTECODE)
	$(UNIT)

lint: venv
	$(PY) -m ruff check torpor tests bench
	$(PY) -m mypy

# A stateful container checkpointed on node A, pushed to a local registry, restored on node B.
demo: demo-deps
	$(PY) -m bench.demo

bench: bench-lifecycle bench-checkpoint bench-image bench-registry

bench-lifecycle: deps
	$(PY) -m bench.lifecycle

bench-checkpoint: deps
	$(PY) -m bench.checkpoint

bench-image: deps
	$(PY) -m bench.image

bench-registry: deps
	$(PY) -m bench.registry

bench-podman: deps
	$(PY) -m bench.podman

# The mutation fuzzer at length: CASES per form, SEED (python -m bench.fuzz --help).
bench-fuzz: deps
	$(PY) -m bench.fuzz --cases $(or $(CASES),300) --seed $(or $(SEED),1)

# System-wide: /opt/torpor venv, fast launchers in $(PREFIX)/bin, the containerd shim launcher
# (another PREFIX: all of it under PREFIX, the config in PREFIX/etc/torpor; packaging/install.sh).
install: demo-deps
	PREFIX=$(PREFIX) bash packaging/install.sh

# Regenerate the containerd API stubs from torpor's own .proto files.
protos:
	$(PY) -m grpc_tools.protoc -I . --python_out=. --pyi_out=. torpor/containerd/api/*.proto

clean:
	rm -rf $(BUILD) .mypy_cache .ruff_cache .pytest_cache
