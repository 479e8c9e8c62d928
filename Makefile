# paygate. `make test` is the test command CI runs (.ci/run); it starts the servers the tests need.
GO ?= go

.PHONY: test test-repeat test-faults test-adaptive services vet fmt lint build bench bench-quick bench-gate bench-fleet clean

# The end-to-end tests (cmd/worker) run real worker processes and measure utilisation, which needs the
# machine to itself: they run after the other packages, not beside them. Then ten seconds of fuzzing the
# job decoder, and ten of its one-pass reader against encoding/json's, from the seed corpus in job/testdata/fuzz.
# Minimising each new input is bounded to a second (-fuzzminimizetime), so the ten seconds go to fuzzing
# rather than to shrinking inputs the decoder refuses at once.
test: services fmt vet lint
	$(GO) test -race -count=1 -timeout 8m $$($(GO) list ./... | grep -v '/cmd/worker$$')
	$(GO) test -race -count=1 -timeout 13m -skip '^TestFault' ./cmd/worker
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 10s -fuzzminimizetime 1s ./job
	$(GO) test -run '^$$' -fuzz '^FuzzMembers$$' -fuzztime 10s -fuzzminimizetime 1s ./job
	$(MAKE) test-faults

# .ci/run (make test) N times in a row, each on a fresh clone of HEAD as CI runs it, then every failure by run and test
# name: for hunting flaky tests (commit first: the clones see HEAD, not the work tree).
N ?= 3
test-repeat:
	scripts/test-repeat.sh $(N)

# The fault suite (docs/reliability.md): Redis flushed, paused, down and restarted; broker connections cut
# and the broker restarted; a worker killed -9 mid-dispatch; provider 500s, hangs, 429 storms and an
# outage; a slow provider against the consumer timeout; the breaker through a three-minute outage and a
# restart of every worker in one, on RabbitMQ and on Kafka. Each ends with the ledger. About 14 minutes
# (the breaker's outage takes 3.5 on each broker). It restarts the RabbitMQ application and changes its consumer_timeout for a while: run it
# alone.
test-faults: services
	$(GO) test -race -count=1 -timeout 25m -run '^TestFault' -v ./cmd/worker

# The learned-limit acceptance (issue 18, docs/operations.md "Learned limits"): two minutes of two workers
# learning a provider's unpublished 80/1s, then its drop to 40/1s. Its utilisation needs the machine to
# itself: not part of make test.
test-adaptive: services
	PAYGATE_TEST_ADAPTIVE=1 $(GO) test -count=1 -timeout 5m -run '^TestAdaptiveLimit$$' -v ./cmd/worker

# Redis on 6379, a 3-node Redis Cluster on 7000-7002, RabbitMQ on 5672; installed with apt-get if missing.
services:
	scripts/services.sh up

# bench/ is a module of its own (the peers it measures stay out of paygate's go.mod): vetted too.
vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

# golangci-lint at a pinned version, built into bin/ on first use (about a minute); .golangci.yml says what
# it checks and why.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(CURDIR)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	mkdir -p $(CURDIR)/bin/.lint
	GOBIN=$(CURDIR)/bin/.lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(CURDIR)/bin/.lint/golangci-lint $@

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

build:
	$(GO) build -o bin/worker ./cmd/worker

# Side-by-side benchmarks with the peers, every algorithm included; rewrites BENCHMARKS.md and bench/plots (about 13 minutes on 2 cores).
bench: services
	cd bench && $(GO) run . -out ../BENCHMARKS.md -plots plots

# Every scenario, briefly: checks the bench runs (its figures are not for quoting).
bench-quick: services
	cd bench && $(GO) run . -quick -out $${TMPDIR:-/tmp}/BENCHMARKS-quick.md -plots $${TMPDIR:-/tmp}/paygate-plots

# The fleet (issue 15): K = 1, 2, 4, 8 separate worker processes with config.yaml's settings, on RabbitMQ and
# Kafka, at 50/1s, 100/1s + 3000/1m and 400/1s, 60s a cell (about 30 minutes); rewrites BENCHMARKS.md's
# section 6 (from bench/fleet.json) and bench/plots/fleet.svg. CELL=10s K=1,2 for a quick look;
# PAYGATE_BENCH_FLEET_ONLY='^kafka/400' measures some cells again.
CELL ?= 60s
K ?= 1,2,4,8
bench-fleet: services
	PAYGATE_BENCH_FLEET=$(CELL) PAYGATE_BENCH_FLEET_K=$(K) PAYGATE_BENCH_FLEET_OUT=$(CURDIR)/BENCHMARKS.md \
		$(GO) test -count=1 -timeout 3h -run '^TestFleetBench$$' -v ./cmd/worker

# The gate's decision cost beside a plain GET on the same client (see docs/testing.md, Benchmarks).
bench-gate: services
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./gate/

clean:
	rm -rf bin
