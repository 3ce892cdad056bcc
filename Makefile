# hookwright Makefile (operator-sdk / kubebuilder go/v4 layout).

VERSION ?= 0.1.0
IMAGE_TAG_BASE ?= ghcr.io/hookwright/hookwright
IMG ?= $(IMAGE_TAG_BASE):v$(VERSION)
BUNDLE_IMG ?= $(IMAGE_TAG_BASE)-bundle:v$(VERSION)
CONTAINER_TOOL ?= docker

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

ROOT := $(shell pwd)
BIN := $(ROOT)/bin
export KUBEBUILDER_ASSETS := $(BIN)/k8s

CONTROLLER_GEN := $(BIN)/controller-gen
KUSTOMIZE := $(BIN)/kustomize
OPERATOR_SDK := $(BIN)/operator-sdk
KUBECTL := $(BIN)/k8s/kubectl
GOLANGCI_LINT := $(BIN)/golangci-lint

GIT_COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# Every go command the targets run (builds, tests, vet, the linters, go run
# and the tests' own go builds) leaves the checkout's path out of what it
# compiles, so every clone and worktree shares one build cache: without it
# a clean clone's make test compiled this module's packages again (60 s of
# its wall time and 120 CPU-s on 2 cores, 2026-12-05). Your GOFLAGS stay.
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)

# Generated paths checked for staleness by `make verify-generated`.
GENERATED := api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml dist/chart

TEST_TIMEOUT ?= 40m
# go test and go vet without cgo: no package of ours has C code, the
# operator's own build (hack/build.sh) and its cache key (hack/ociimage)
# use CGO_ENABLED=0 already, so one build configuration serves all three;
# with cgo, kustomize's import of plugin made nine test binaries link
# through gcc. Linking every test binary: 144 CPU-s with cgo, 97 without
# (2026-12-06, 2 cores). -ldflags=-w leaves DWARF out of the test binaries
# (stack traces and pprof read the symbol and line tables, which stay):
# `go test -c` of all 51 test binaries, twice each way beside a test run,
# 143-166 CPU-s with DWARF and 97-108 without (2026-12-06).
GOTEST := CGO_ENABLED=0 go test -ldflags=-w
# Test packages run at once. The cluster packages mostly wait on their
# control planes and nodes (about a quarter of 2 cores busy at go test's
# default of GOMAXPROCS), and every real node takes its own slot. Five at
# once starved the e2e stack's API server on 2 cores (its operator lost
# its Lease for 90 s; 2026-12-05), so four.
TEST_PARALLEL ?= 4
# The cluster packages, longest first: go test starts packages in the
# order it is given them, so the long poles do not wait behind the
# unit tests for a slot. test/e2e/standalone is the demo's scenario 9 on
# a stack of its own, so test/e2e is not the one long pole.
CLUSTER_TEST_PKGS := ./test/e2e ./test/node ./test/e2e/standalone ./test/operator ./test/integration ./test/usage ./test/scale ./test/olm

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: tool-controller-gen ## Generate CRDs and RBAC from markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: tool-controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run gofmt -w.
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	CGO_ENABLED=0 go vet ./...

.PHONY: verify-fmt
verify-fmt: ## Fail if any file needs gofmt.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: verify-generated
verify-generated: manifests generate chart ## Fail if generated files differ from the committed ones.
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		echo "generated files are stale; run 'make manifests generate chart' and commit:"; \
		git status --porcelain -- $(GENERATED); git diff --stat -- $(GENERATED); exit 1; fi

# The Helm chart is config/default (plus config/prometheus and
# config/networkpolicy behind values) rendered with the kustomize library
# and templatised by internal/helmchart; internal/helmchart's test also
# fails when dist/chart is stale.
.PHONY: chart
chart: manifests ## Generate the Helm chart dist/chart from config/ (internal/helmchart).
	go run ./hack/chartgen

.PHONY: verify-tidy
verify-tidy: ## Fail if go.mod/go.sum are not tidy.
	go mod tidy -diff

.PHONY: lint
lint: tool-golangci-lint ## Run the linters of .golangci.yml (golangci-lint, built into bin/).
	$(GOLANGCI_LINT) run ./...

.PHONY: verify-no-binaries
verify-no-binaries: ## Fail if git tracks a compiled executable (ELF, Mach-O, PE).
	@hack/verify-no-binaries.sh

.PHONY: verify
verify: verify-fmt vet verify-tidy verify-generated verify-no-binaries lint ## gofmt, go vet, go mod tidy, the stale-generated check, no tracked binaries and the linters.

# The other packages make test runs: everything outside CLUSTER_TEST_PKGS.
OTHER_TEST_PKGS = $$(go list ./... | grep -v -x $(foreach p,$(CLUSTER_TEST_PKGS),-e 'github.com/hookwright/hookwright/$(p:./%=%)'))
# Slots for OTHER_TEST_PKGS, beside the cluster packages' TEST_PARALLEL.
OTHER_TEST_PARALLEL ?= 2

# make test runs the cluster packages and the others as two go test runs at
# once. In one run the others queued behind the cluster packages for slots
# and ran last, about 140 s after test/e2e, the longest, had ended
# (2026-12-05). The others' output is printed as one block when they end;
# make test fails if either run fails. -vet=off: verify's go vet ./... ran
# first.
.PHONY: test
test: tools node-prereqs verify ## Run every test (builds the tools it needs first).
	@out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	echo "$(GOTEST) -count=1 -vet=off -p $(OTHER_TEST_PARALLEL) -timeout $(TEST_TIMEOUT) <the other packages> (output below when it ends)"; \
	( rc=0; $(GOTEST) -count=1 -vet=off -p $(OTHER_TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(OTHER_TEST_PKGS) >"$$out" 2>&1 || rc=$$?; cat "$$out"; exit $$rc ) & other=$$!; \
	echo "$(GOTEST) -count=1 -vet=off -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(CLUSTER_TEST_PKGS)"; \
	rc=0; $(GOTEST) -count=1 -vet=off -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(CLUSTER_TEST_PKGS) || rc=$$?; \
	wait $$other || rc=1; exit $$rc

.PHONY: node-prereqs
node-prereqs: ## Install the Debian packages the real test node needs, if missing (root).
	@hack/node-prereqs.sh

.PHONY: test-unit
test-unit: ## Run the tests that need no control plane: every package outside test/, and the test images' programs (cluster.New refuses to start one).
	HOOKWRIGHT_NO_CONTROL_PLANE=1 $(GOTEST) -count=1 $$(go list ./... | grep -v -e /test/) ./test/images/...

# -race needs cgo (the race runtime is C); run beside make test, not in it:
# it builds every package a second time and runs them several times slower.
.PHONY: test-race
test-race: ## Run make test-unit's packages under the race detector (cgo on).
	HOOKWRIGHT_NO_CONTROL_PLANE=1 CGO_ENABLED=1 go test -race -count=1 $$(go list ./... | grep -v -e /test/) ./test/images/...

# One suite at a time, each one package with make test's flags
# (test/README.md maps each feature to its tests in these suites).
TEST_SUITES := test-e2e test-operator test-node test-usage test-integration test-scale test-olm test-bundle
.PHONY: $(TEST_SUITES)
test-e2e: ## Run test/e2e/... alone: the demo's scenarios and the install block of docs/install.md.
test-operator: ## Run test/operator alone: the operator against a real control plane.
test-node: ## Run test/node alone: the operator's servers and rollout on a real node (root).
test-usage: ## Run test/usage alone: usage-aware NodeOversell with metrics-server and a real node (root).
test-integration: ## Run test/integration alone: the harness and both servers against the real API server.
test-scale: ## Run test/scale alone, at make test's sizes (make scale measures the full ones).
test-olm: ## Run test/olm alone: the bundle through OLM on the harness cluster.
test-bundle: ## Run test/bundle alone: the committed bundle (no control plane).
$(TEST_SUITES): tools node-prereqs
	$(GOTEST) -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) ./test/$(@:test-%=%)/...

# The older Kubernetes minors make test-compat runs the API-server-level
# suites against (docs/versions.md); the oldest is the CSV's minKubeVersion.
COMPAT_MINORS ?= 1.33 1.35
COMPAT_TEST_PKGS := ./test/operator ./test/integration ./test/olm

.PHONY: test-compat
test-compat: tools node-prereqs ## Run test/operator, test/integration and test/olm against each older control plane of COMPAT_MINORS (not part of make test).
	hack/tools.sh $(foreach m,$(COMPAT_MINORS),kube-apiserver-$(m) kube-controller-manager-$(m) kube-scheduler-$(m))
	@set -e; for m in $(COMPAT_MINORS); do \
		echo "test-compat: Kubernetes $$m"; \
		HOOKWRIGHT_KUBE_VERSION=$$m $(GOTEST) -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(COMPAT_TEST_PKGS); \
	done

.PHONY: scale
scale: tools ## Measure NodeOversell at 10, 100 and 1,000 nodes, fleet status at 10,000 pods and the pod sweep (SWEEP_PODS) into _scale/ (not part of make test).
	HOOKWRIGHT_SCALE=full HOOKWRIGHT_SWEEP_PODS=$(SWEEP_PODS) HOOKWRIGHT_SWEEP_MEMORY_LIMIT=$(SWEEP_MEMORY_LIMIT) $(GOTEST) -count=1 -timeout 3h -run '^(TestScale|TestFleetScale|TestPodSweep)$$' -v ./test/scale/

# The real-node load tests at the size they were written at: more dry-run
# pod creates a second through the injector's restarts and container
# kills, and a 60 s freeze of an oversell replica. make test runs them
# smaller, with the same checks (docs/development.md).
SOAK_TESTS := TestInjectorZeroDropThroughServerRestarts|TestKillServerContainerUnderLoad|TestOversellServerFrozen

.PHONY: soak
soak: tools node-prereqs ## Run test/node's load tests and the injector's slow-client soak at full size (HOOKWRIGHT_SCALE=full, root; not part of make test).
	HOOKWRIGHT_SCALE=full $(GOTEST) -count=1 -timeout 1h -run '^TestSoakSlowClients$$' -v ./webhooks/sidecar/
	HOOKWRIGHT_SCALE=full $(GOTEST) -count=1 -timeout 1h -run '^TestInjectorProcessUnderSlowClients$$' -v ./test/integration/
	HOOKWRIGHT_SCALE=full $(GOTEST) -count=1 -timeout 1h -run '^($(SOAK_TESTS))$$' -v ./test/node/

# SWEEP_PODS is the pod sweep's number of running pods (plus 1/12 finished,
# 1/15 namespaces, 50 SidecarInjectors): 10000, 50000 or 150000.
SWEEP_PODS ?= 10000
# SWEEP_MEMORY_LIMIT is the sweep's memory limit (a quantity, e.g. 448Mi),
# from which each replica sets its Go soft limit; empty: the shipped one.
SWEEP_MEMORY_LIMIT ?=
# SWEEP_WATCHLIST=false starts the sweep's API server without WatchList, so
# the pod index takes its paged list.
SWEEP_WATCHLIST ?= true
# SWEEP_APISERVER_MEMORY is the sweep's kube-apiserver GOMEMLIMIT (empty:
# 10GiB, 16GiB from 100,000 pods: it holds 11.5 GiB at 150,000).
SWEEP_APISERVER_MEMORY ?=
# SWEEP_GOGC is the replicas' GOGC (empty: Go's default, 100, as shipped).
SWEEP_GOGC ?=

.PHONY: scale-pods
scale-pods: tools ## Only the pod sweep at SWEEP_PODS running pods (SWEEP_MEMORY_LIMIT: the replicas' memory limit, default the shipped one; SWEEP_WATCHLIST=false: the paged list) into _scale/report-podsweep-N.md (not part of make test).
	HOOKWRIGHT_SWEEP_PODS=$(SWEEP_PODS) HOOKWRIGHT_SWEEP_MEMORY_LIMIT=$(SWEEP_MEMORY_LIMIT) HOOKWRIGHT_SWEEP_WATCHLIST=$(SWEEP_WATCHLIST) HOOKWRIGHT_SWEEP_APISERVER_MEMORY=$(SWEEP_APISERVER_MEMORY) HOOKWRIGHT_SWEEP_GOGC=$(SWEEP_GOGC) $(GOTEST) -count=1 -timeout 3h -run '^TestPodSweep$$' -v ./test/scale/

.PHONY: bench
bench: ## Run the benchmarks.
	$(GOTEST) -run '^$$' -bench . -benchmem ./webhooks/...

##@ Build

.PHONY: build
build: ## Build bin/hookwright (static; the same hack/build.sh the Dockerfile runs).
	hack/build.sh $(BIN)/hookwright v$(VERSION) $(GIT_COMMIT)

# PREFIX is where kubectl-plugin installs (PREFIX/bin must be on PATH).
PREFIX ?= $(HOME)/.local

.PHONY: kubectl-plugin
kubectl-plugin: ## Install the binary as kubectl's plugin PREFIX/bin/kubectl-hookwright (PREFIX default ~/.local) with its completion helper: kubectl hookwright ...
	mkdir -p $(PREFIX)/bin
	hack/build.sh $(PREFIX)/bin/kubectl-hookwright v$(VERSION) $(GIT_COMMIT)
	printf '#!/bin/sh\n# kubectl (1.26+) runs this to complete "kubectl hookwright ..." (docs/cli.md).\nexec kubectl-hookwright __complete "$$@"\n' >$(PREFIX)/bin/kubectl_complete-hookwright
	chmod 0755 $(PREFIX)/bin/kubectl_complete-hookwright

.PHONY: run
run: manifests generate ## Run the manager against the current kubeconfig.
	go run ./cmd manager

.PHONY: docker-build
docker-build: ## Build the container image (needs a Docker engine).
	$(CONTAINER_TOOL) build --build-arg VERSION=v$(VERSION) --build-arg GIT_COMMIT=$(GIT_COMMIT) -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the container image.
	$(CONTAINER_TOOL) push $(IMG)

# Images without a Docker engine (hack/imagectl, hack/ociimage): OCI
# layouts under _images/ (gitignored); IMAGE_REGISTRY=127.0.0.1:PORT also
# pushes them to a local registry (`make image-registry` runs one).
IMAGES_DIR ?= $(ROOT)/_images
IMAGE_REGISTRY ?=
IMAGE_SETS ?= operator pause standins
IMAGECTL_FLAGS = --version v$(VERSION) --commit $(GIT_COMMIT) --name $(IMG) $(if $(IMAGE_REGISTRY),--push $(IMAGE_REGISTRY))

.PHONY: image
image: ## Build the operator image without Docker into _images/operator (OCI layout); IMAGE_REGISTRY=host:port pushes it too.
	go run ./hack/imagectl build $(IMAGECTL_FLAGS) --layout $(IMAGES_DIR)/operator operator

.PHONY: images
images: ## Build IMAGE_SETS (operator pause standins; olm too needs busybox-static) into _images/all and _images/images.tar (ctr images import).
	go run ./hack/imagectl build $(IMAGECTL_FLAGS) --layout $(IMAGES_DIR)/all --archive $(IMAGES_DIR)/images.tar $(IMAGE_SETS)

.PHONY: image-registry
image-registry: ## Serve every image from a registry on 127.0.0.1 (IMAGE_LISTEN, default a free port) with containerd hosts config in _images/certs.d; runs until interrupted.
	go run ./hack/imagectl registry --version v$(VERSION) --commit $(GIT_COMMIT) --name $(IMG) \
		--listen $(or $(IMAGE_LISTEN),127.0.0.1:0) --hosts-dir $(IMAGES_DIR)/certs.d --addr-file $(IMAGES_DIR)/registry.addr $(IMAGE_SETS)

##@ Local control plane

.PHONY: demo
demo: ## The main job end to end: local control plane, operator, both webhooks, the scenarios' report; left running.
	@hack/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything make demo started and remove its files (_demo/).
	@hack/demo.sh down

##@ Deployment

.PHONY: install
install: manifests tool-kustomize ## Install CRDs into the cluster of the current kubeconfig.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests tool-kustomize delete-crs ## Uninstall CRDs (their custom resources first).
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests tool-kustomize ## Deploy the operator (IMG=...) to the cluster of the current kubeconfig.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
# What the operator itself created (hookwright-validation, the CA and
# serving Secrets) is owned by the CRDs: the garbage collector deletes it
# with them (controllers/installowners.go).
undeploy: tool-kustomize delete-crs ## Remove the operator: custom resources first, then its manifests (and, with the CRDs, what it created).
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found -f -

# Custom resources go first, while the operator still runs: a NodeOversell's
# finalizer restores its nodes' real allocatable, and deleting the namespace,
# ServiceAccount or CRDs under it would leave the CR stuck and the nodes
# inflated. Fails (instead of going on) if they are not gone in time.
DELETE_CRS_TIMEOUT ?= 120s
.PHONY: delete-crs
delete-crs: ## Delete every SidecarInjector and NodeOversell and wait for their finalizers.
	@for r in sidecarinjectors.admission.hookwright.io nodeoversells.admission.hookwright.io; do \
		if $(KUBECTL) get crd $$r >/dev/null 2>&1; then \
			$(KUBECTL) delete $$r --all --wait --timeout=$(DELETE_CRS_TIMEOUT) || exit 1; \
		fi; \
	done

# OLM bundle: channel candidate (maturity alpha; OLM's channel naming
# convention is candidate/fast/stable). operator-sdk is built from its pinned module on
# first use (`make tool-operator-sdk`); `make test` does not need it: the
# committed bundle is validated and checked for staleness in Go (test/bundle).
BUNDLE_CHANNELS ?= candidate
BUNDLE_DEFAULT_CHANNEL ?= candidate
BUNDLE_GEN_FLAGS ?= -q --overwrite --version $(VERSION) --channels=$(BUNDLE_CHANNELS) --default-channel=$(BUNDLE_DEFAULT_CHANNEL)
USE_IMAGE_DIGESTS ?= false
ifeq ($(USE_IMAGE_DIGESTS), true)
BUNDLE_GEN_FLAGS += --use-image-digests
endif

.PHONY: bundle
bundle: manifests tool-kustomize tool-operator-sdk ## Generate bundle/ and bundle.Dockerfile from config/ (VERSION=x.y.z IMG=...) and validate them.
	$(OPERATOR_SDK) generate kustomize manifests --interactive=false -q
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	@# generate bundle never deletes a manifest whose source is gone.
	rm -rf bundle/manifests
	$(KUSTOMIZE) build config/manifests | $(OPERATOR_SDK) generate bundle $(BUNDLE_GEN_FLAGS)
	@# operator-sdk stamps createdAt on every run: keep the committed CSV when
	@# nothing else in it changed, so an unchanged bundle leaves git clean.
	@if git diff --quiet -I '^    createdAt: ' -- bundle/manifests/hookwright.clusterserviceversion.yaml 2>/dev/null; then \
		git checkout -q -- bundle/manifests/hookwright.clusterserviceversion.yaml 2>/dev/null || true; fi
	$(OPERATOR_SDK) bundle validate ./bundle --select-optional suite=operatorframework
	@$(MAKE) --no-print-directory scorecard

.PHONY: scorecard
scorecard: tool-scorecard-test ## Run the scorecard's basic and OLM suites offline against ./bundle (hack/scorecard.sh).
	hack/scorecard.sh bundle

# OLM without Docker (hack/runbundle, docs/install.md): the
# images pushed to IMAGE_REGISTRY and operator-sdk run against the cluster of
# KUBECONFIG; what the environment leaves unset (IMAGE_REGISTRY, KUBECONFIG,
# SSL_CERT_FILE) comes from the running demo's $(DEMO_DIR)/env. Each command
# run is printed first.
DEMO_DIR ?= $(ROOT)/_demo
BUNDLE_NAMESPACE ?= hookwright-system
BUNDLE_TIMEOUT ?= 5m
RUNBUNDLE = go run ./hack/runbundle
RUNBUNDLE_FLAGS = --demo-dir $(DEMO_DIR) --version $(VERSION) --img $(IMG) --bundle-img $(BUNDLE_IMG) --namespace $(BUNDLE_NAMESPACE) --timeout $(BUNDLE_TIMEOUT)

.PHONY: bundle-image
bundle-image: tool-opm ## Without Docker: operator, bundle (VERSION other than bundle/'s: a derived one replacing it), empty index and OLM pod images -> IMAGE_REGISTRY (default the demo's).
	@$(RUNBUNDLE) image $(RUNBUNDLE_FLAGS) --commit $(GIT_COMMIT)

.PHONY: run-bundle
run-bundle: tool-operator-sdk ## operator-sdk run bundle of bundle-image's bundle into BUNDLE_NAMESPACE (cluster of KUBECONFIG, default the demo's); a failed run cleans up.
	@$(RUNBUNDLE) run $(RUNBUNDLE_FLAGS)

.PHONY: run-bundle-upgrade
run-bundle-upgrade: tool-operator-sdk ## operator-sdk run bundle-upgrade to VERSION (after make bundle-image VERSION=...).
	@$(RUNBUNDLE) upgrade $(RUNBUNDLE_FLAGS)

.PHONY: cleanup-bundle
cleanup-bundle: tool-operator-sdk ## operator-sdk cleanup hookwright: the OLM install in BUNDLE_NAMESPACE and its CRDs, so every SidecarInjector and NodeOversell.
	@$(RUNBUNDLE) cleanup $(RUNBUNDLE_FLAGS)

.PHONY: bundle-build
bundle-build: ## Build the bundle image (needs a Docker engine).
	$(CONTAINER_TOOL) build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image.
	$(CONTAINER_TOOL) push $(BUNDLE_IMG)

##@ Tools (built from the Go module proxy into bin/, see hack/tools.sh)

.PHONY: tools
tools: ## Build the tools the tests need (etcd, Kubernetes v1.37.2, kwok, controller-gen, golangci-lint, OLM v0.33.0, opm, helm, promtool, prometheus).
	@hack/tools.sh

.PHONY: tools-all
tools-all: ## Build every tool, kustomize and operator-sdk included.
	@hack/tools.sh all

.PHONY: tool-%
tool-%: ## Build one tool if it is missing or its pin changed, e.g. make tool-kwok.
	@hack/tools.sh $*
