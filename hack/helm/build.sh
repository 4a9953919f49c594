#!/usr/bin/env bash
# Build the helm CLI from its Go module, once.
#
# helm's source comes through the Go module proxy into the Go module cache, never into
# this repository: go.mod beside this script pins helm.sh/helm/v3 and lists cmd/helm as a
# Go tool. The binary lands in ${HAMI_CACHE_DIR:-$HOME/.cache/hami}/helm-<version>/bin;
# one that is already there is not rebuilt.
#
# Usage: hack/helm/build.sh             build if missing, print the bin directory
#        hack/helm/build.sh --print-dir only print the bin directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(grep -oE '^\s*(require\s+)?helm\.sh/helm/v3 v[0-9][^ ]*' "$here/go.mod" | awk '{print $NF}')"
if [[ -z "$version" ]]; then
	echo "build.sh: no helm.sh/helm/v3 requirement in $here/go.mod" >&2
	exit 1
fi
bindir="${HAMI_CACHE_DIR:-$HOME/.cache/hami}/helm-$version/bin"
if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$bindir"
	exit 0
fi
if [[ -x "$bindir/helm" ]]; then
	echo "$bindir"
	exit 0
fi
command -v go >/dev/null || { echo "build.sh: needs Go" >&2; exit 1; }
mkdir -p "$bindir"
exec 9>"$bindir/.lock"
flock 9
if [[ ! -x "$bindir/helm" ]]; then
	export GOCACHE="$(dirname "$bindir")/go-build"
	cd "$here"
	# The Kubernetes version helm assumes without a cluster (helm template, lint): the one
	# of its client-go, as helm's own Makefile stamps it (v0.37.x => 1.37).
	kminor="$(grep -oE 'k8s\.io/client-go v0\.[0-9]+' go.mod | head -1 | cut -d. -f3)"
	k8sflags=""
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		k8sflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
	done
	echo "build.sh: building helm $version ..." >&2
	start=$SECONDS
	CGO_ENABLED=0 go build -trimpath \
		-ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version$k8sflags" \
		-o "$bindir/.helm.tmp" helm.sh/helm/v3/cmd/helm
	mv -f "$bindir/.helm.tmp" "$bindir/helm"
	echo "build.sh: built helm in $((SECONDS - start))s" >&2
	[[ "${HAMI_HELM_KEEP_GOCACHE:-0}" == 1 ]] || rm -rf "$GOCACHE"
fi
echo "$bindir"
