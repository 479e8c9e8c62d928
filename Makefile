# paygate. `make test` is the test command CI runs (.ci/run); it starts the servers the tests need.
GO ?= go

.PHONY: test services vet fmt build bench-gate clean

# The end-to-end tests (cmd/worker) run real worker processes and measure utilisation, which needs the
# machine to itself: they run after the other packages, not beside them.
test: services fmt vet
	$(GO) test -race -count=1 -timeout 5m $$($(GO) list ./... | grep -v '/cmd/worker$$')
	$(GO) test -race -count=1 -timeout 8m ./cmd/worker

# Redis on 6379, a 3-node Redis Cluster on 7000-7002, RabbitMQ on 5672; installed with apt-get if missing.
services:
	scripts/services.sh up

vet:
	$(GO) vet ./...

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

build:
	$(GO) build -o bin/worker ./cmd/worker

# The gate's decision cost beside a plain GET on the same client (see README, Benchmarks).
bench-gate: services
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./gate/

clean:
	rm -rf bin
