#!/usr/bin/env bash
# make demo / make demo-down: the local control plane, the real node
# system-0 with the operator and its webhook servers in real containers, and
# the end-to-end scenarios, left running in the background
# (hack/localcluster). The real node needs root and the Debian packages
# hack/node-prereqs.sh installs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DEMO_DIR:-$ROOT/_demo}
# The lock sits outside $DIR (up removes and recreates $DIR): one up or down
# at a time. Two concurrent ups used to share $DIR, overwrite each other's
# pid file and leave one localcluster (and its ten children) running.
LOCK=$DIR.lock
cd "$ROOT"

lock() {
	exec 9>"$LOCK"
	if ! flock -n 9; then
		echo "demo: another make demo/demo-down holds $LOCK; waiting for it"
		flock 9
	fi
}

# descendants PID: the pids of PID's process tree below it, deepest last.
descendants() {
	local c
	for c in $(pgrep -P "$1" 2>/dev/null || true); do
		echo "$c"
		descendants "$c"
	done
}

down() {
	lock
	local netns=""
	[[ -f $DIR/netns ]] && netns=$(cat "$DIR/netns")
	if [[ -f $DIR/pid ]]; then
		pid=$(cat "$DIR/pid")
		if kill -0 "$pid" 2>/dev/null; then
			# localcluster's children (etcd, kube-apiserver, kcm, scheduler,
			# kwok, the node's containerd, kubelet, kube-proxy) run in their
			# own process groups with Pdeathsig=SIGKILL; localcluster stops
			# them on SIGTERM, the real node first (its pods deleted, then
			# containers, cgroups, mounts, network removed), and logs what
			# was left. Their pids are taken first so that none outlives it.
			tree=$(descendants "$pid")
			kill "$pid"
			for _ in $(seq 1 900); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
			kill -9 "$pid" 2>/dev/null || true
			for c in $tree; do kill -9 "$c" 2>/dev/null || true; done
		fi
	fi
	local leaks=""
	if [[ -f $DIR/localcluster.log ]]; then
		leaks=$(grep '^leak: ' "$DIR/localcluster.log" || true)
	fi
	if [[ -n $netns ]] && ip netns list 2>/dev/null | grep -qw "$netns"; then
		leaks+=$'\n'"leak: network namespace $netns"
	fi
	if grep -q " $DIR/" /proc/mounts 2>/dev/null; then
		leaks+=$'\n'"leak: mounts under $DIR: $(grep " $DIR/" /proc/mounts | awk '{print $2}' | tr '\n' ' ')"
	else
		rm -rf "$DIR"
	fi
	if [[ -n ${leaks//[$'\n']/} ]]; then
		echo "demo: stopped, but left behind:$leaks" >&2
		exit 1
	fi
	echo "demo: stopped and removed $DIR; nothing left behind (processes, containers, cgroups, mounts, netns, routes, packet filter)"
}

up() {
	lock
	if [[ -f $DIR/pid ]] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
		echo "demo: already running; kubeconfig: $DIR/kubeconfig (make demo-down to stop)"
		[[ -f $DIR/report.txt ]] && cat "$DIR/report.txt"
		return
	fi
	# Only the tools the demo runs (hack/tools.sh demo: not the linters or
	# generators), then the real node's Debian packages; the images are
	# built by localcluster itself (hack/ociimage).
	hack/tools.sh demo
	make --no-print-directory node-prereqs
	rm -rf "$DIR"
	mkdir -p "$DIR"
	go build -o bin/localcluster ./hack/localcluster
	nohup bin/localcluster --dir "$DIR" >"$DIR/localcluster.log" 2>&1 9>&- &
	echo $! >"$DIR/pid"
	echo "demo: starting (log: $DIR/localcluster.log); images, the real node and the scenarios take about 5 minutes"
	tail -n +1 --pid=$$ -f "$DIR/localcluster.log" &
	local tailpid=$!
	trap 'kill "$tailpid" 2>/dev/null || true' RETURN
	for _ in $(seq 1 1800); do
		if [[ -f $DIR/ready ]]; then
			sleep 0.3 # let tail print the report's last lines
			if [[ $(cat "$DIR/status" 2>/dev/null) != pass ]]; then
				echo "demo: a scenario failed (report: $DIR/report.txt); the cluster is left running for a look" >&2
				exit 1
			fi
			return
		fi
		if ! kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
			sleep 0.3
			echo "demo: localcluster exited (log: $DIR/localcluster.log)" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "demo: timed out after 15 minutes (log: $DIR/localcluster.log)" >&2
	exit 1
}

case ${1:-up} in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
