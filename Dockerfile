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

RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w -X github.com/hookwright/hookwright/internal/version.Version=${VERSION} -X github.com/hookwright/hookwright/internal/version.GitCommit=${GIT_COMMIT}" \
    -o hookwright ./cmd

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/hookwright /hookwright
USER 65532:65532
ENTRYPOINT ["/hookwright"]
CMD ["manager"]
