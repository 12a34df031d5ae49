# syntax=docker/dockerfile:1
#
# The sidecar-supervisor image: one static binary on an empty filesystem, for
# linux/amd64 and linux/arm64 from this one file. The build stage runs on the
# build machine's platform and cross-compiles for the target (Go needs no
# emulation for that), so a multi-platform build is fast on any builder:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t REGISTRY/sidecar-supervisor:v0.1.0 --build-arg VERSION=v0.1.0 --push .
#
# (docs/install.md, "Building the image", says how to push it to your own registry
# and point the manifests at it.)
#
# The e2e tests build the same image without a Docker engine or registry
# (e2e/scripts/build-image.sh): they run the build stage's `go build` line with
# the local Go toolchain and build the runtime stage from this file, so both
# stages must stay in the shape that script parses (it says so when they don't):
#   - the build stage's compile step is one
#     `RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build ... -o /out/...` line;
#   - the runtime stage is the last stage and copies only from the build stage.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so a source change does not download them again.
COPY go.* ./
RUN go mod download
COPY . .
ARG VERSION=dev
# Set by BuildKit (and buildah) per target platform, e.g. linux + arm64.
ARG TARGETOS
ARG TARGETARCH
# Static (no libc), without paths of the build machine, stripped; the version
# goes into the start-up log line.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/sidecar-supervisor ./cmd/sidecar-supervisor

FROM scratch AS runtime
ARG VERSION=dev
ARG REVISION=unknown
ARG LICENSES=NOASSERTION
LABEL org.opencontainers.image.source="https://github.com/sidecar-supervisor/sidecar-supervisor" \
      org.opencontainers.image.title="sidecar-supervisor" \
      org.opencontainers.image.description="Stops a Job pod's Istio sidecar once the application containers have exited" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# CA certificates, for an https action URL. Go reads this path first on Linux.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/sidecar-supervisor /sidecar-supervisor
# Istio's proxy uid, the one pilot-agent runs as: the same uid may signal it
# without CAP_KILL, and Istio's iptables rules let this uid's traffic bypass envoy.
USER 1337:1337
ENTRYPOINT ["/sidecar-supervisor"]
