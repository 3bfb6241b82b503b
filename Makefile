# isolatord build, test, lint, bench and demo entry points.
# Everything a target needs is installed by scripts/ in this repository.

GO          ?= go
BIN         := bin
TOOLS       := $(CURDIR)/.tools/bin
STATICCHECK_VERSION := v0.8.2
FUZZTIME    ?= 30s
TEST_TIMEOUT ?= 30m
PKGS        := ./...
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X main.version=$(VERSION) -X main.buildVersion=$(VERSION)

.PHONY: all build deb test test-nomad lint bench demo proto generate fuzz deps clean

all: build

# The CNI plugin and the CLI are built without cgo: static binaries start
# without the dynamic loader and libc (runtimes exec the plugin for every
# attachment), and run on any host; and with grpc-go's grpcnotrace tag, which
# leaves out golang.org/x/net/trace (html/template and its init) that a
# client never uses. The daemon is built as before.
STATIC_CMDS := ./cmd/isolator-cni ./cmd/isolatorctl
STATIC_TAGS := grpcnotrace
CMDS        := $(patsubst %/main.go,%,$(wildcard ./cmd/*/main.go))

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(filter-out $(STATIC_CMDS),$(CMDS))
	CGO_ENABLED=0 $(GO) build -tags $(STATIC_TAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/ $(STATIC_CMDS)

# deb builds bin/isolatord_<version>_<arch>.deb (scripts/build-deb.sh,
# docs/packaging.md): the binaries with this build's version stamp, the
# units, the configuration as conffiles, man pages and examples.
deb:
	VERSION=$(VERSION) GO=$(GO) STATIC_TAGS=$(STATIC_TAGS) scripts/build-deb.sh $(BIN)

# deps installs the system tools tests use (iproute2, util-linux) when missing.
deps:
	@scripts/install-deps.sh

# test runs every package's tests (fuzz seeds included). Integration tests need
# root; they build their own network-namespace sandboxes and skip when not root.
# -p 1: kernel tests of different packages would otherwise compete for the CPUs and time out.
test: deps build
	$(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

# test-nomad builds a Nomad 1.6.0 agent (MPL-2.0; minutes, cached; scripts/build-nomad.sh refuses
# the BSL-licensed 1.7.0 and later) and runs the Nomad end-to-end test (test/e2e/nomad_test.go).
# Not part of test.
test-nomad: deps build
	NOMAD_BIN=$$(scripts/build-nomad.sh) && \
	  NOMAD_BIN=$$NOMAD_BIN $(GO) test -p 1 -count=1 -timeout $(TEST_TIMEOUT) -run '^TestNomad' -v ./test/e2e/

lint: $(TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(TOOLS)/staticcheck $(PKGS)

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

bench: deps build
	@scripts/bench.sh

demo: deps build
	@scripts/demo.sh

proto:
	@scripts/proto.sh

# generate recompiles the BPF programs (C in tcfilter/bpfprog) with clang
# through bpf2go; the objects it writes are committed, so build and test
# need no C toolchain. It installs clang, llvm and libbpf-dev when missing.
generate:
	@scripts/install-deps.sh bpf
	$(GO) generate ./tcfilter/...

# fuzz runs each fuzz target for FUZZTIME.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN) .tools
