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
# shellcheck source=hack/lib.sh
source "$here/../lib.sh"
hack_init helm.sh/helm/v3 helm "${1:-}"
if hack_all_have helm >&2; then
	echo "$bindir"
	exit 0
fi
hack_lock
if ! hack_have helm >&2; then
	# The Kubernetes version helm assumes without a cluster (helm template, lint): the one
	# of its client-go, as helm's own Makefile stamps it (v0.37.x => 1.37).
	kminor="$(grep -oE 'k8s\.io/client-go v0\.[0-9]+' go.mod | head -1 | cut -d. -f3)"
	k8sflags=""
	for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		k8sflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
	done
	hack_go_build helm helm.sh/helm/v3/cmd/helm \
		-ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version$k8sflags" >&2
	hack_drop_gocache "${HAMI_HELM_KEEP_GOCACHE:-0}" >&2
fi
echo "$bindir"
