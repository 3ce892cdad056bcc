#!/usr/bin/env bash
# Runs the scorecard's basic and OLM suites offline against ./bundle.
#
#   hack/scorecard.sh [BUNDLE_DIR]      # default: bundle
#
# `operator-sdk scorecard` runs bin/scorecard-test (built from operator-sdk's
# images/scorecard-test, `hack/tools.sh scorecard-test`) in a pod with the
# bundle mounted at /bundle, a path compiled into the program. These tests are
# static checks of the bundle, so here each runs in a throw-away user and
# mount namespace whose root is an empty tmpfs holding only the (static)
# program and a bind mount of the bundle at /bundle: no cluster, no image, no
# change to the host. The tests run are those in bundle/tests/scorecard/config.yaml.
set -euo pipefail

if [[ ${1:-} == --in-namespace ]]; then
	# Inside the namespaces: $2 = program, $3 = bundle, $4 = test, $5 = an
	# empty directory (the tmpfs root; only this namespace sees the mount).
	r=$5
	mount -t tmpfs tmpfs "$r"
	mkdir "$r/bundle" "$r/bin" "$r/tmp"
	mount --bind -o ro "$3" "$r/bundle"
	cp "$2" "$r/bin/scorecard-test"
	exec unshare --root="$r" /bin/scorecard-test "$4"
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/bin}
bundle=$(cd "${1:-$ROOT/bundle}" && pwd)
prog=$BIN/scorecard-test

[[ -x $prog ]] || { echo "scorecard: $prog missing; run hack/tools.sh scorecard-test" >&2; exit 1; }
tests=$(sed -n 's/^ *- \(\(basic\|olm\)-[a-z-]*\)$/\1/p' "$bundle/tests/scorecard/config.yaml")
[[ -n $tests ]] || { echo "scorecard: no tests in $bundle/tests/scorecard/config.yaml" >&2; exit 1; }

failed=0
for t in $tests; do
	r=$(mktemp -d)
	if ! out=$(unshare --user --map-root-user --mount "${BASH_SOURCE[0]}" --in-namespace "$prog" "$bundle" "$t" "$r" 2>&1); then
		rmdir "$r"
		echo "scorecard: $t: could not run (user namespaces unavailable?):"; echo "$out"; exit 1
	fi
	rmdir "$r"
	state=$(sed -n 's/^ *"state": "\([a-z]*\)",*$/\1/p' <<<"$out" | sort -u | tr '\n' ' ')
	if [[ $state != "pass " ]]; then
		echo "scorecard: $t: ${state:-no result}"; grep -v '"log"' <<<"$out"; failed=1
	else
		echo "scorecard: $t: pass"
		grep -A3 '"suggestions"' <<<"$out" | sed 's/^/    /' || true
	fi
done
exit $failed
