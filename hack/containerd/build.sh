#!/usr/bin/env bash
# Build containerd, its runc shim (containerd-shim-runc-v2) and ctr for the real test
# node (hami.testing.node), once.
#
# The containerd release is the one pinned in go.mod beside this script; its source comes
# through the Go module proxy into the Go module cache, never into this repo. runc itself
# stays the machine's (Debian's `runc` package).
# Binaries land in ${HAMI_CACHE_DIR:-$HOME/.cache/hami}/containerd-<version>/bin and a
# binary that is already there is not rebuilt, so running this again is cheap.
#
# Usage: hack/containerd/build.sh            build what is missing, print the bin directory
#        hack/containerd/build.sh --print-dir only print the bin directory
#
# CONTAINERD_VERSION=v1.7.35 (or 1.7.35; else HAMI_CONTAINERD_VERSION) builds another release pinned in versions/<version>/
# (its go.mod lists the three commands as tools; the 1.x line is module
# github.com/containerd/containerd, without /v2) into containerd-<version>/bin.
#
# Built with CGO_ENABLED=0 as containerd's Makefile builds its shim, and with the build tags
# that leave out the snapshotters the node does not use (btrfs needs libbtrfs headers;
# devmapper and zfs need their tools): only overlayfs and native are built in.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
source "$here/../lib.sh"
names=(containerd containerd-shim-runc-v2 ctr)
pkg=github.com/containerd/containerd/v2
want="${CONTAINERD_VERSION:-${HAMI_CONTAINERD_VERSION:-}}"
if [[ -n "$want" ]]; then
	[[ "$want" == v* ]] || want="v$want"
	if [[ -f "$here/versions/$want/go.mod" ]]; then
		here="$here/versions/$want"
		[[ "$want" == v2.* ]] || pkg=github.com/containerd/containerd
	elif ! grep -qE "^\s*(require\s+)?${pkg//./\\.} $want( |\$)" "$here/go.mod"; then
		echo "build.sh: containerd $want is not pinned (pinned: $(cd "$here/versions" \
			2>/dev/null && ls | tr '\n' ' ')and the go.mod here)" >&2
		exit 1
	fi
fi
hack_init "$pkg" containerd "${1:-}"
if hack_all_have "${names[@]}"; then
	echo "$bindir"
	exit 0
fi
hack_lock

ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Revision=hami-hack-containerd"
tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"

for name in "${names[@]}"; do
	hack_have "$name" && continue
	name_tags="$tags"
	# the shim is a ttrpc server only, as containerd's Makefile builds it
	[[ "$name" != containerd-shim-runc-v2 ]] || name_tags+=" no_grpc"
	hack_go_build "$name" "$pkg/cmd/$name" -ldflags="$ldflags" -tags "$name_tags"
done
hack_drop_gocache "${HAMI_CONTAINERD_KEEP_GOCACHE:-0}"
echo "$bindir"
