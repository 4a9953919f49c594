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
# The Go build cache of these builds (about 3 GiB) lives beside bin/ and is removed once
# all binaries are there; HAMI_K8S_KEEP_GOCACHE=1 keeps it (faster rebuilds after edits).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(grep -oE '^\s*(require\s+)?k8s\.io/kubernetes v[0-9][^ ]*' "$here/go.mod" | awk '{print $NF}')"
if [[ -z "$version" ]]; then
	echo "build.sh: no k8s.io/kubernetes requirement in $here/go.mod" >&2
	exit 1
fi
bindir="${HAMI_CACHE_DIR:-$HOME/.cache/hami}/k8s-$version/bin"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$bindir"
	exit 0
fi

command -v go >/dev/null || { echo "build.sh: needs Go (see go.mod for the version)" >&2; exit 1; }
mkdir -p "$bindir"
# One build at a time per cache directory (parallel test sessions share it).
exec 9>"$bindir/.lock"
flock 9

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

export GOCACHE="$(dirname "$bindir")/go-build"
cd "$here"
for name in kube-apiserver kube-scheduler kubelet kube-controller-manager etcd; do
	if [[ -x "$bindir/$name" ]]; then
		echo "build.sh: $name present in $bindir"
		continue
	fi
	echo "build.sh: building $name ($version) from ${pkgs[$name]} ..."
	start=$SECONDS
	CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$bindir/.$name.tmp" "${pkgs[$name]}"
	mv -f "$bindir/.$name.tmp" "$bindir/$name"
	echo "build.sh: built $name in $((SECONDS - start))s ($(du -h "$bindir/$name" | cut -f1))"
done
if [[ "${HAMI_K8S_KEEP_GOCACHE:-0}" != 1 && -d "$GOCACHE" ]]; then
	echo "build.sh: removing the build cache $GOCACHE ($(du -sh "$GOCACHE" | cut -f1))"
	rm -rf "$GOCACHE"
fi
echo "$bindir"
