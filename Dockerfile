# paygate worker: a static binary on a distroless base, run as a non-root user.
#   docker build -t paygate .
#   docker run --rm paygate demo            # the whole system in one container, nothing else needed
#   docker run --rm -e PAYGATE_AMQP_URL=... -v $PWD/config.yaml:/etc/paygate/config.yaml:ro paygate run

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/worker ./cmd/worker

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/worker /usr/local/bin/worker
COPY config.yaml /etc/paygate/config.yaml
ENV PAYGATE_CONFIG=/etc/paygate/config.yaml \
    PAYGATE_HTTP_LISTEN=0.0.0.0:9090
USER 65532:65532
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/worker"]
CMD ["run"]
