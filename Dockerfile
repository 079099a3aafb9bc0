# syntax=docker/dockerfile:1
# Sturdy: static binary on distroless, running as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) -t sturdy .
#   docker run -p 127.0.0.1:8080:8080 --add-host=host.docker.internal:host-gateway \
#     -e STURDY_UPSTREAM=http://host.docker.internal:11434 sturdy

# The build stage runs on the builder's own platform and cross-compiles for the target's
# (docker buildx --platform linux/amd64,linux/arm64: no emulation; tools/release.sh).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# --build-arg TAGS=sturdy_notracing leaves the OTLP exporters out: a quarter
# less memory, no tracing (docs/observability.md, Traces).
ARG TAGS=""
# The same flags .ci/run checks: static, reproducible, version stamped.
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -tags "${TAGS}" \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/sturdy .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sturdy /sturdy
COPY config.example.yaml /etc/sturdy/config.example.yaml
# In a container the admin listener must be reachable by probes: bind all
# interfaces (it stays off the public port; publish 9090 only to your
# monitoring). These are defaults only: a mounted config's listen and
# admin_listen win over them (STURDY_LISTEN / STURDY_ADMIN_LISTEN, or the
# flags, win over the file).
ENV STURDY_DEFAULT_LISTEN=:8080 \
    STURDY_DEFAULT_ADMIN_LISTEN=:9090
EXPOSE 8080 9090
# distroless's nonroot user, by number: a kubelet verifies runAsNonRoot only
# against a numeric user (deploy/kubernetes.yaml sets the same 65532).
USER 65532:65532
# -healthcheck without -config probes the admin listener of PID 1 (this
# Sturdy) as its own command line configured it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/sturdy", "-healthcheck"]
ENTRYPOINT ["/sturdy"]
