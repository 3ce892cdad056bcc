#!/usr/bin/env bash
# Installs the Debian packages the real test node needs (test/cluster
# RealNode, test/node) when they are missing: runc, the packet filter
# kube-proxy and CNI's portmap drive, iproute2 and nsenter, and a static
# busybox for the OLM pod images (hack/ociimage, test/olm). It needs root
# and apt-get; without them it says what is missing and the node tests
# fail naming it (there is no fallback).
set -euo pipefail

need=()
[ -x /usr/sbin/runc ] || command -v runc >/dev/null || need+=(runc)
command -v iptables-restore >/dev/null || need+=(iptables)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
[ -x /bin/busybox ] || need+=(busybox-static)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "node-prereqs: missing ${need[*]} (install them as root: apt-get install ${need[*]})" >&2
	exit 0
fi
echo "node-prereqs: apt-get install ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
