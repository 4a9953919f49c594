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
# Built with CGO_ENABLED=0 as containerd's Makefile builds its shim, and with the build tags
# that leave out the snapshotters the node does not use (btrfs needs libbtrfs headers;
# devmapper and zfs need their tools): only overlayfs and native are built in.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(grep -oE '^\s*(require\s+)?github\.com/containerd/containerd/v2 v[0-9][^ ]*' "$here/go.mod" | awk '{print $NF}')"
if [[ -z "$version" ]]; then
	echo "build.sh: no github.com/containerd/containerd/v2 requirement in $here/go.mod" >&2
	exit 1
fi
bindir="${HAMI_CACHE_DIR:-$HOME/.cache/hami}/containerd-$version/bin"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$bindir"
	exit 0
fi

command -v go >/dev/null || { echo "build.sh: needs Go (see go.mod for the version)" >&2; exit 1; }
mkdir -p "$bindir"
# One build at a time per cache directory (parallel test sessions share it).
exec 9>"$bindir/.lock"
flock 9

pkg=github.com/containerd/containerd/v2
ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Revision=hami-hack-containerd"
tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"

export GOCACHE="$(dirname "$bindir")/go-build"
cd "$here"
for name in containerd containerd-shim-runc-v2 ctr; do
	if [[ -x "$bindir/$name" ]]; then
		echo "build.sh: $name present in $bindir"
		continue
	fi
	extra=()
	# the shim is a ttrpc server only, as containerd's Makefile builds it
	[[ "$name" == containerd-shim-runc-v2 ]] && extra=(-tags "$tags no_grpc")
	[[ "$name" != containerd-shim-runc-v2 ]] && extra=(-tags "$tags")
	echo "build.sh: building $name ($version) ..."
	start=$SECONDS
	CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" "${extra[@]}" \
		-o "$bindir/.$name.tmp" "$pkg/cmd/$name"
	mv -f "$bindir/.$name.tmp" "$bindir/$name"
	echo "build.sh: built $name in $((SECONDS - start))s ($(du -h "$bindir/$name" | cut -f1))"
done
if [[ "${HAMI_CONTAINERD_KEEP_GOCACHE:-0}" != 1 && -d "$GOCACHE" ]]; then
	echo "build.sh: removing the build cache $GOCACHE ($(du -sh "$GOCACHE" | cut -f1))"
	rm -rf "$GOCACHE"
fi
echo "$bindir"
