# LazyFork. `make demo` and `make test` set up everything they need (idempotently).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
BIN := $(CURDIR)/bin
STAGES := lf-dump lf-memfile lf-restore lf-overlay lf-cgroup lf-tree lf-inspect
GO ?= go

.PHONY: all build setup image demo test doctor bench bench-smoke fork-memory clean vet

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/lazyfork ./cmd/lazyfork
	$(GO) build -o $(BIN)/lazyfork-engine ./cmd/lazyfork-engine
	$(GO) build -o $(BIN)/lazyfork-helper ./cmd/lazyfork-helper
	@ln -sf lazyfork $(BIN)/lfork
	@for s in $(STAGES); do if [ -d $$s ]; then $(GO) build -o $(BIN)/$$s ./$$s || exit 1; fi; done

# Host packages: CRIU >= 4.1, debootstrap, ...
setup:
	@bash scripts/setup.sh

# The offline default image (debootstrap minbase + python3), built once.
image: setup build
	@$(BIN)/lazyfork image build-default >/dev/null

doctor: build
	@$(BIN)/lazyfork doctor

demo: setup build image
	@bash scripts/demo.sh

# Every test: the Go packages as root on real kernel objects, the benchmark's smoke run,
# then the set-up in a clean bookworm root, make install/uninstall and the wheel.
test: setup build image vet
	LF_REQUIRE_PRIV=1 LAZYFORK_BIN=$(BIN) $(GO) test -count=1 -timeout 25m -p 1 ./...
	@bash bench/run.sh --smoke
	@bash bench/run.sh --smoke --fork-memory
	@bash scripts/test-setup.sh
	@bash scripts/test-install.sh
	@bash scripts/test-wheel.sh

# The benchmark of issue/spec: CSVs, PNG plots and a Markdown summary in bench/results/.
bench: setup build image
	@bash bench/run.sh

# One fork of a 256 MiB agent sampled every 0.5 s for 30 s (bench/fork_memory.py): shared
# (memory files) vs private pages; bench/results/fork_memory.{csv,png}, the PNG copied to docs/.
fork-memory: build image
	@bash bench/run.sh --fork-memory
	@cp bench/results/fork_memory.png docs/fork-memory.png

# A short run of the same benchmark that only checks it still works (CI runs it in make test).
bench-smoke: build image
	@bash bench/run.sh --smoke
	@bash bench/run.sh --smoke --fork-memory

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting" >&2; exit 1; }

clean:
	rm -rf $(BIN)

# The set-up itself, in a clean Debian bookworm root (debootstrap, cached in /var/cache/lazyfork/):
# only packages of the release added, nothing upgraded, CRIU works there, a second run changes nothing.
.PHONY: test-setup
test-setup: build
	@bash scripts/test-setup.sh

# make install / make uninstall [PREFIX=/usr/local] [DESTDIR=] [PYTHON=python3]: the binaries
# (lazyfork, lfork, lf-*), a systemd unit for `lazyfork daemon run`, bash and zsh completion,
# and the Python SDK (if $(PYTHON) has pip); uninstall removes what the manifest
# $(PREFIX)/share/lazyfork/install-manifest lists. scripts/test-install.sh tests both.
PREFIX ?= /usr/local
DESTDIR ?=
PYTHON ?= python3
.PHONY: install uninstall
install: build
	@PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" BIN="$(BIN)" PYTHON="$(PYTHON)" STAGES="$(STAGES)" bash packaging/install.sh install

uninstall:
	@PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" bash packaging/install.sh uninstall

# The privileged Go tests on a pure cgroup v2 machine: Debian trixie's kernel booted in qemu
# with cgroup_no_v1=all, on a debootstrapped trixie root with its CRIU, cached in
# /var/cache/lazyfork/v2 (settings: the header of scripts/test-v2.sh). go test's ok/FAIL lines.
.PHONY: test-v2
test-v2: build image
	@LAZYFORK_BIN="$(BIN)" bash scripts/test-v2.sh

# CRIU's zdtm static tests, each through a fork, a plain CRIU copy and the source
# (scripts/zdtm/): bench/results/zdtm.csv and docs/zdtm.md. Quick runs:
# make zdtm ZDTM_ARGS="--only 'socket|maps' --limit 10" (results in /var/tmp/lazyfork-zdtm).
.PHONY: zdtm
zdtm: image
	@bash scripts/zdtm/run.sh $(ZDTM_ARGS)

# A platform wheel: the Python SDK plus static lazyfork and stage binaries as scripts, so
# `pip install dist/lazyfork-*-linux_*.whl` puts them on PATH. test-wheel installs it into
# a temporary prefix and runs each binary.
.PHONY: wheel test-wheel
wheel:
	@bash scripts/wheel.sh dist

test-wheel:
	@bash scripts/test-wheel.sh
