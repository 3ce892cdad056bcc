#!/usr/bin/env bash
# make demo / make demo-down: the local control plane in the background.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DEMO_DIR:-$ROOT/_demo}
cd "$ROOT"

down() {
	if [[ -f $DIR/pid ]]; then
		pid=$(cat "$DIR/pid")
		if kill -0 "$pid" 2>/dev/null; then
			kill "$pid"
			for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
			kill -9 "$pid" 2>/dev/null || true
		fi
	fi
	rm -rf "$DIR"
	echo "demo: stopped and removed $DIR"
}

up() {
	if [[ -f $DIR/pid ]] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
		echo "demo: already running; kubeconfig: $DIR/kubeconfig (make demo-down to stop)"
		return
	fi
	rm -rf "$DIR"
	mkdir -p "$DIR"
	go build -o bin/localcluster ./hack/localcluster
	nohup bin/localcluster --dir "$DIR" >"$DIR/localcluster.log" 2>&1 &
	echo $! >"$DIR/pid"
	echo "demo: starting the local control plane (log: $DIR/localcluster.log)"
	for _ in $(seq 1 600); do
		if [[ -f $DIR/ready ]]; then
			cat "$DIR/localcluster.log"
			echo
			echo "demo: cluster running. Try:"
			echo "  bin/k8s/kubectl --kubeconfig $DIR/kubeconfig get nodes"
			echo "  make demo-down   # stop it"
			return
		fi
		if ! kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
			cat "$DIR/localcluster.log"
			echo "demo: the local control plane exited" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "demo: timed out waiting for the control plane" >&2
	exit 1
}

case ${1:-up} in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
