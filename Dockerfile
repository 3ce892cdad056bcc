# Build the hookwright binary (manager, injector and oversell server in one).
FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=v0.0.0-dev
ARG GIT_COMMIT=unknown

WORKDIR /workspace
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY webhooks/ webhooks/

COPY hack/build.sh hack/build.sh

# hack/build.sh is the one build command (CGO_ENABLED=0, -trimpath, version
# ldflags); `make build` and the tests in test/bundle run the same script.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} hack/build.sh hookwright ${VERSION} ${GIT_COMMIT}

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/hookwright /hookwright
USER 65532:65532
ENTRYPOINT ["/hookwright"]
CMD ["manager"]
