#!/usr/bin/env bash
# Builds the pinned tools into bin/ from the Go module proxy, idempotently.
#
# Each tool has its own module under hack/tools/<module>/ (its go.mod is the
# pin), so tools that drag different Kubernetes versions never meet. A tool is
# rebuilt only when its module's go.mod/go.sum or build flags change: the hash
# of those is kept in bin/.stamps/<tool>.
#
#   hack/tools.sh                 # the tools the tests need
#   hack/tools.sh demo            # the tools make demo runs (no linters, no generators)
#   hack/tools.sh all             # every tool
#   hack/tools.sh compat          # the older control planes of make test-compat
#   hack/tools.sh kwok kustomize  # just these
#
# It prints a line as each tool starts and ends, with how many are left,
# and every minute which tool it is still building.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/bin}
K8S_VERSION=v1.37.2
# Older minors whose control plane make test-compat runs the API-server-level
# suites against (docs/versions.md); each has its module hack/tools/k8s-<minor>.
# The oldest is the CSV's minKubeVersion (test/bundle checks it).
declare -A K8S_COMPAT=([1.33]=v1.33.13 [1.35]=v1.35.4)
STAMPS=$BIN/.stamps
mkdir -p "$BIN/k8s" "$STAMPS"

# k8s_ldflags [VERSION]: the version stamp (default K8S_VERSION) that
# kube-apiserver reports on /version and that test/cluster reads.
k8s_ldflags() {
	local full=${1:-$K8S_VERSION}
	local v=${full#v}
	local major=${v%%.*} rest=${v#*.}
	local minor=${rest%%.*}
	local p=k8s.io/component-base/version
	echo "-s -w -X $p.gitVersion=$full -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitCommit=$full -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
}

# tool name -> "module|output|env|tags|ldflags|packages..."
spec() {
	case $1 in
	kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet | kube-proxy)
		echo "k8s|$BIN/k8s/$1|||$(k8s_ldflags)|k8s.io/kubernetes/cmd/$1" ;;
	# kube-apiserver-1.33 -> bin/k8s-1.33/kube-apiserver, and so
	# kube-controller-manager and kube-scheduler (make test-compat).
	kube-apiserver-* | kube-controller-manager-* | kube-scheduler-*)
		local m=${1##*-} c=${1%-*}
		[[ -n ${K8S_COMPAT[$m]:-} ]] || { echo "unknown Kubernetes minor: $m (have ${!K8S_COMPAT[*]})" >&2; return 1; }
		mkdir -p "$BIN/k8s-$m"
		echo "k8s-$m|$BIN/k8s-$m/$c|||$(k8s_ldflags "${K8S_COMPAT[$m]}")|k8s.io/kubernetes/cmd/$c" ;;
	etcd) echo "etcd|$BIN/k8s/etcd|||-s -w|go.etcd.io/etcd/server/v3" ;;
	# The real test node (test/cluster RealNode): containerd, its runc shim and
	# ctr into bin/node/, the CNI plugins into bin/cni/. Static, without the
	# snapshotters that need cgo or kernel features the node does not use.
	containerd)
		local p=github.com/containerd/containerd/v2
		echo "containerd|$BIN/node/|CGO_ENABLED=0|no_btrfs no_devmapper no_zfs|-s -w -X $p/version.Version=2.4.2|$p/cmd/containerd $p/cmd/containerd-shim-runc-v2 $p/cmd/ctr" ;;
	cni-plugins)
		local p=github.com/containernetworking/plugins/plugins
		echo "cni|$BIN/cni/|CGO_ENABLED=0||-s -w|$p/main/bridge $p/ipam/host-local $p/main/loopback $p/meta/portmap" ;;
	kwok) echo "kwok|$BIN/kwok|||-s -w|sigs.k8s.io/kwok/cmd/kwok" ;;
	# metrics.k8s.io for the usage-aware NodeOversell (test/cluster
	# Options.MetricsServer); its version is client-go's version stamp.
	metrics-server)
		local p=k8s.io/client-go/pkg/version
		echo "metrics-server|$BIN/metrics-server|CGO_ENABLED=0||-s -w -X $p.gitVersion=v0.9.0 -X $p.gitCommit=v0.9.0 -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z|sigs.k8s.io/metrics-server/cmd/metrics-server" ;;
	controller-gen) echo "controller-gen|$BIN/controller-gen|||-s -w|sigs.k8s.io/controller-tools/cmd/controller-gen" ;;
	kustomize) echo "kustomize|$BIN/kustomize|||-s -w|sigs.k8s.io/kustomize/kustomize/v5" ;;
	# make verify's linters (.golangci.yml).
	golangci-lint)
		local p=main
		echo "golangci-lint|$BIN/golangci-lint|CGO_ENABLED=0||-s -w -X $p.version=2.15.0 -X $p.commit=v2.15.0 -X $p.date=2026-01-01T00:00:00Z|github.com/golangci/golangci-lint/v2/cmd/golangci-lint" ;;
	operator-sdk)
		local p=github.com/operator-framework/operator-sdk/internal/version
		echo "operator-sdk|$BIN/operator-sdk|CGO_ENABLED=0|containers_image_openpgp|-s -w -X $p.Version=v1.42.2 -X $p.GitVersion=v1.42.2 -X $p.ImageVersion=v1.42.2|github.com/operator-framework/operator-sdk/cmd/operator-sdk" ;;
	olm | catalog)
		local p=github.com/operator-framework/operator-lifecycle-manager/pkg/version
		echo "olm|$BIN/$1|||-s -w -X $p.OLMVersion=0.33.0 -X $p.GitCommit=v0.33.0|github.com/operator-framework/operator-lifecycle-manager/cmd/$1" ;;
	olm-crds) echo "olm|$BIN/olm-crds|||-s -w|./olm-crds" ;;
	opm)
		local p=github.com/operator-framework/operator-registry/cmd/opm/version
		echo "opm|$BIN/opm|CGO_ENABLED=0|containers_image_openpgp|-s -w -X $p.gitCommit=v1.59.0 -X $p.opmVersion=v1.59.0 -X $p.buildDate=2026-01-01T00:00:00Z|github.com/operator-framework/operator-registry/cmd/opm" ;;
	# The scorecard's basic and OLM tests (the program of operator-sdk's
	# scorecard-test image), run offline by hack/scorecard.sh.
	scorecard-test) echo "operator-sdk|$BIN/scorecard-test|CGO_ENABLED=0|containers_image_openpgp|-s -w|github.com/operator-framework/operator-sdk/images/scorecard-test" ;;
	# The chart tests (test/olm helm_test.go) install, upgrade and uninstall
	# dist/chart with the real helm.
	helm)
		local p=helm.sh/helm/v4/internal/version
		echo "helm|$BIN/helm|CGO_ENABLED=0||-s -w -X $p.version=v4.3.2 -X $p.gitCommit=v4.3.2 -X $p.gitTreeState=clean|helm.sh/helm/v4/cmd/helm" ;;
	# promtool tests the PrometheusRule and parses the dashboard's
	# expressions (internal/monitoring tests). Both Prometheus tools are
	# built with only the Kubernetes service discovery: every cloud's SDK
	# (the AWS EC2 client alone takes minutes and 3 GB) is not needed, and
	# so their cold build is 188 s + 73 s instead of 366 s for promtool
	# alone (2026-12-06).
	promtool)
		local p=github.com/prometheus/common/version
		echo "promtool|$BIN/promtool|CGO_ENABLED=0|remove_all_sd,enable_kubernetes_sd|-s -w -X $p.Version=0.316.0 -X $p.Revision=v0.316.0 -X $p.Branch=v0.316.0 -X $p.BuildDate=20260101-00:00:00|github.com/prometheus/prometheus/cmd/promtool" ;;
	# prometheus scrapes the demo's operator, servers and API server and
	# evaluates the alerts (test/e2e/scenarios/prometheus.go).
	prometheus)
		local p=github.com/prometheus/common/version
		echo "promtool|$BIN/prometheus|CGO_ENABLED=0|remove_all_sd,enable_kubernetes_sd|-s -w -X $p.Version=3.16.0 -X $p.Revision=v0.316.0 -X $p.Branch=v0.316.0 -X $p.BuildDate=20260101-00:00:00|github.com/prometheus/prometheus/cmd/prometheus" ;;
	*) echo "unknown tool: $1" >&2; return 1 ;;
	esac
}

# operator-sdk is a test tool too: test/olm runs `operator-sdk run bundle`.
TEST_TOOLS=(etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kwok metrics-server controller-gen golangci-lint olm-crds olm catalog opm kubelet kube-proxy containerd cni-plugins operator-sdk helm promtool prometheus)
# make test-compat's older control planes (not in make tools: each is a
# cold build of many CPU-minutes). The scheduler and the controller manager
# must not be newer than the API server: kube-scheduler v1.37 waits for
# resource.k8s.io/v1 informers that a 1.33 server cannot fill.
COMPAT_TOOLS=()
for m in $(printf '%s\n' "${!K8S_COMPAT[@]}" | sort -V); do
	COMPAT_TOOLS+=("kube-apiserver-$m" "kube-controller-manager-$m" "kube-scheduler-$m")
done
ALL_TOOLS=("${TEST_TOOLS[@]}" kustomize scorecard-test)
# make demo runs these: the control plane, kwok, metrics-server (scenario
# 9), the real node, OLM and opm (scenario 5), operator-sdk (scenario 7,
# make run-bundle). Not
# controller-gen, golangci-lint, kustomize or scorecard-test, which only
# make verify, make bundle and make scorecard run.
DEMO_TOOLS=(etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kwok metrics-server kubelet kube-proxy containerd cni-plugins olm-crds olm catalog opm operator-sdk)

# build TOOL I N: builds tool I of N unless it is current.
build() {
	local tool=$1 i=$2 n=$3 s mod out env tags ldflags pkgs stamp want
	s=$(spec "$tool")
	IFS='|' read -r mod out env tags ldflags pkgs <<<"$s"
	# A module's own Go files (e.g. hack/tools/olm/olm-crds) are part of the pin too.
	want=$(cat "$ROOT/hack/tools/$mod/go.mod" "$ROOT/hack/tools/$mod/go.sum" <(echo "$s" | sed "s|$BIN|BIN|g") \
		<(cd "$ROOT/hack/tools/$mod" && find . -name '*.go' | LC_ALL=C sort | xargs -r cat) | sha256sum | cut -d' ' -f1)
	stamp=$STAMPS/$tool
	if [[ -x $out && -f $stamp && $(cat "$stamp") == "$want" ]]; then
		echo "tools: [$i/$n] $tool is current; $((n - i)) left"
		return
	fi
	echo "tools: [$i/$n] building $tool (module hack/tools/$mod) ...; $((n - i)) left after it"
	echo "$tool $i $n $(date +%s)" >"$CURRENT"
	local start=$SECONDS
	(
		cd "$ROOT/hack/tools/$mod"
		# shellcheck disable=SC2086
		env $env go build ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$out" $pkgs
	)
	echo "$want" >"$stamp"
	echo "tools: [$i/$n] built $tool in $((SECONDS - start))s; $((n - i)) left"
}

tools=("$@")
if [[ ${#tools[@]} -eq 0 ]]; then
	tools=("${TEST_TOOLS[@]}")
elif [[ ${tools[0]} == all ]]; then
	tools=("${ALL_TOOLS[@]}")
elif [[ ${tools[0]} == compat ]]; then
	tools=("${COMPAT_TOOLS[@]}")
elif [[ ${tools[0]} == demo ]]; then
	tools=("${DEMO_TOOLS[@]}")
fi

# Ticker so a cold build (many CPU-minutes) never looks hung: once a minute
# it names the tool being built and for how long. It sleeps in 1 s steps: a
# killed ticker leaves at most a 1 s sleep holding our stdout, so `make
# tools | cat` ends at once.
CURRENT=$(mktemp)
(
	n=0
	while sleep 1; do
		n=$((n + 1))
		if ((n % 60 == 0)) && read -r t i total since <"$CURRENT" 2>/dev/null; then
			echo "tools: [$i/$total] still building $t ($(($(date +%s) - since))s so far, $(date +%H:%M:%S))"
		fi
	done
) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true; rm -f "$CURRENT"' EXIT

start=$SECONDS
for i in "${!tools[@]}"; do
	build "${tools[$i]}" $((i + 1)) ${#tools[@]}
done
echo "tools: ${#tools[@]} tools current ($((SECONDS - start))s)"
