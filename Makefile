# Quartermaster: the two commands that matter are `make up` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(wildcard protos/qm/v1/*.proto)
GEN_STAMP := gen/.generated
TEST_KAFKA_PORT ?= 19092
TEST_KAFKA_TLS_PORT ?= 19094
TEST_KAFKA_DIR := $(CURDIR)/.local/kafka-test
TEST_KAFKA := QM_KAFKA_DIR=$(TEST_KAFKA_DIR) QM_KAFKA_PORT=$(TEST_KAFKA_PORT) \
  QM_KAFKA_TLS_PORT=$(TEST_KAFKA_TLS_PORT)
# The tests log in as the broker's admin; each service they start, as its own principal.
TEST_KAFKA_LOGIN := QM_KAFKA_BOOTSTRAP=127.0.0.1:$(TEST_KAFKA_PORT) \
  QM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT QM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 \
  QM_KAFKA_SASL_USERNAME=admin QM_KAFKA_SASL_PASSWORD_FILE=$(TEST_KAFKA_DIR)/users/admin \
  QM_KAFKA_USERS_DIR=$(TEST_KAFKA_DIR)/users QM_KAFKA_TLS_PORT=$(TEST_KAFKA_TLS_PORT)
CHAOS_BUDGET ?= 600
CHAOS_PORT_BASE ?= 29400
CHAOS_ARGS ?=

# The API's tools, built with `go install` from pinned versions into .local/go-tools,
# one folder per version (a bump installs anew, nothing is fetched twice).
GO ?= go
BUF_VERSION := v1.50.0
PROTOC_GEN_GO_VERSION := v1.36.5
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
GO_TOOLS := $(CURDIR)/.local/go-tools
BUF := $(GO_TOOLS)/buf-$(BUF_VERSION)/buf
PROTOC_GEN_GO := $(GO_TOOLS)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(GO_TOOLS)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
GO_GENERATE := PATH=$(dir $(PROTOC_GEN_GO)):$(dir $(PROTOC_GEN_GO_GRPC)):$$PATH $(BUF) generate

.PHONY: install protos up down test test-unit chaos lint typecheck bench kafka-start kafka-stop clean \
  api-tools buf-lint go-client go-client-check k8s-validate example-image

WEB := services/console/web
WEB_STAMP := $(WEB)/node_modules/.package-lock.json

install: $(STAMP) $(GEN_STAMP) $(WEB_STAMP)

# The console's chart library, exactly as its lock file pins it (served as a static file).
$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund

# gen/qm must exist before the editable install so that the package is found.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	mkdir -p gen/qm/v1 && touch gen/qm/__init__.py gen/qm/v1/__init__.py
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

protos: $(GEN_STAMP)

$(GEN_STAMP): $(PROTOS) $(STAMP)
	mkdir -p gen/qm/v1 && touch gen/qm/__init__.py gen/qm/v1/__init__.py
	$(PY) -m grpc_tools.protoc -I protos \
	  --python_out=gen --grpc_python_out=gen \
	  --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --mypy_out=gen \
	  --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=gen \
	  $(PROTOS)
	touch gen/qm/py.typed $@

$(BUF):
	GOBIN=$(@D) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(PROTOC_GEN_GO):
	GOBIN=$(@D) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(@D) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# The pinned API tools, built once (go may say what it downloads the first time).
api-tools: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)

# The API's rules (protos/buf.yaml): buf's STANDARD set and a comment on everything.
# PROTO_DIR: another copy of protos/ to judge (the tests check the rules bite).
PROTO_DIR ?= protos
buf-lint: $(BUF)
	cd $(PROTO_DIR) && $(BUF) lint

# The Go client's generated code (clients/go/qm/v1) is committed, so that `go get`
# works: regenerate it after changing a proto, and commit the result.
go-client: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	rm -rf clients/go/qm
	cd protos && $(GO_GENERATE) -o ../clients/go
	cd clients/go && $(GO) build ./... && $(GO) vet ./...

# Fails when the committed Go code is not what the protos generate.
go-client-check: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@fresh=$$(mktemp -d) && trap 'rm -rf "$$fresh"' EXIT && \
	(cd protos && $(GO_GENERATE) -o "$$fresh") && \
	diff -r "$$fresh/qm" clients/go/qm || \
	{ echo "clients/go/qm is stale: run make go-client and commit it" >&2; exit 1; }

up: install
	deploy/local/stack.sh up

down:
	deploy/local/stack.sh down

kafka-start:
	deploy/local/kafka.sh start

kafka-stop:
	deploy/local/kafka.sh stop

# localhost/qm-example:1 for jobs' --image, from Debian's busybox-static (apt; no registry),
# into the node agent's podman storage: PODMAN_ROOT and PODMAN_DRIVER as its sandbox file's
# containers storage_root and storage_driver (docs/containers.md). As root; once.
PODMAN_ROOT ?= $(CURDIR)/.local/podman
PODMAN_DRIVER ?= overlay
example-image: install
	deploy/images/example.sh $(PODMAN_ROOT) $(PODMAN_DRIVER)

# Starts a broker of its own (separate port and data folder), runs every test,
# and stops the broker whatever the outcome.
test: install
	$(TEST_KAFKA) deploy/local/kafka.sh start
	$(TEST_KAFKA_LOGIN) $(PY) -m pytest -q; status=$$?; \
	$(TEST_KAFKA) deploy/local/kafka.sh stop; exit $$status

# The chaos and fuzz suite (tests/chaos): a stack of its own (broker on
# CHAOS_PORT_BASE, the next four ports for its services) under kills, fuzzing and
# poison records, within CHAOS_BUDGET seconds; prints a table, writes
# .local/chaos/results.json, and fails if an invariant does. Whatever the outcome,
# nothing of the run is left running.
chaos: install
	timeout --signal=TERM --kill-after=60 $$(( $(CHAOS_BUDGET) + 240 )) \
	  $(PY) -m tests.chaos --budget $(CHAOS_BUDGET) --port-base $(CHAOS_PORT_BASE) $(CHAOS_ARGS); \
	status=$$?; $(PY) -m tests.chaos --cleanup; exit $$status

# Renders both Kubernetes overlays with the pinned kustomize (built with Go into
# .local/bin on first use) and validates every resource offline: the Kubernetes API's
# schemas and Strimzi's (deploy/k8s/schemas). tests/unit/deploy/test_k8s.py runs it too.
k8s-validate: install
	$(PY) deploy/k8s/manifests.py

test-unit: install
	$(PY) -m pytest -q -m 'not kafka'

lint: install
	$(BIN)/ruff check libs services cli tests deploy
	$(BIN)/ruff format --check libs services cli tests deploy
	$(BIN)/mypy

bench: install
	$(PY) -m tests.perf.bench

clean: down
	rm -rf $(VENV) gen .local
