#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler, kubelet, kube-controller-manager and etcd for the
# e2e tests, once.
#
# The Kubernetes release is the one pinned in go.mod beside this script; its source
# comes through the Go module proxy into the Go module cache, never into this repo.
# Binaries land in ${HAMI_CACHE_DIR:-$HOME/.cache/hami}/k8s-<version>/bin and a binary
# that is already there is not rebuilt, so running this again is cheap.
#
# Usage: hack/k8s/build.sh            build what is missing, print the bin directory
#        hack/k8s/build.sh --print-dir only print the bin directory
#
# K8S_VERSION=v1.31.14 (or 1.31.14; else HAMI_K8S_VERSION, the tests' variable) builds
# another release pinned by hack/k8s/pin.sh in versions/<version>/ instead (into
# k8s-<version>/bin); unset or equal to the go.mod pin here, it builds that pin.
#
# The Go build cache of these builds (about 3 GiB) lives beside bin/ and is removed once
# all binaries are there; HAMI_K8S_KEEP_GOCACHE=1 keeps it (faster rebuilds after edits).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
source "$here/../lib.sh"
names=(kube-apiserver kube-scheduler kubelet kube-controller-manager etcd)
want="${K8S_VERSION:-${HAMI_K8S_VERSION:-}}"
if [[ -n "$want" ]]; then
	[[ "$want" == v* ]] || want="v$want"
	if [[ -f "$here/versions/$want/go.mod" ]]; then
		here="$here/versions/$want"
	elif ! grep -qE "^\s*(require\s+)?k8s\.io/kubernetes $want( |\$)" "$here/go.mod"; then
		echo "build.sh: Kubernetes $want is not pinned: run hack/k8s/pin.sh $want first" \
			"(pinned: $(cd "$here/versions" 2>/dev/null && ls | tr '\n' ' '))" >&2
		exit 1
	fi
fi
hack_init k8s.io/kubernetes k8s "${1:-}"
if hack_all_have "${names[@]}"; then
	echo "$bindir"
	exit 0
fi
hack_lock

major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean"
done

# name => Go package (relative packages are ours, in this module)
declare -A pkgs=(
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
	[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
	[kubelet]=k8s.io/kubernetes/cmd/kubelet
	[etcd]=./cmd/etcd
)

for name in "${names[@]}"; do
	hack_have "$name" && continue
	hack_go_build "$name" "${pkgs[$name]}" -ldflags="$ldflags"
done
hack_drop_gocache "${HAMI_K8S_KEEP_GOCACHE:-0}"
echo "$bindir"
