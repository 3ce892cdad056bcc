#!/usr/bin/env bash
# Builds the static hookwright binary. This is the one build command: the
# Dockerfile's builder stage and `make build` both run it, and test/bundle
# runs it too, so CI catches a broken image build step without Docker.
#
#   hack/build.sh OUTPUT [VERSION [GIT_COMMIT]]
#
# GOOS/GOARCH come from the environment (the Dockerfile sets them from
# TARGETOS/TARGETARCH). The binary is static (CGO_ENABLED=0) so it runs on
# distroless/static, and -trimpath keeps build paths out of it.
set -euo pipefail

out=${1:?usage: hack/build.sh OUTPUT [VERSION [GIT_COMMIT]]}
version=${2:-v0.0.0-dev}
commit=${3:-unknown}
pkg=github.com/hookwright/hookwright/internal/version

case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CGO_ENABLED=0 exec go build -trimpath \
	-ldflags "-s -w -X $pkg.Version=$version -X $pkg.GitCommit=$commit" \
	-o "$out" ./cmd
