# shellcheck shell=bash
# shellcheck disable=SC2154  # `here` is set by the sourcing script
# Shared steps of hack/*/build.sh, sourced by them (never run). Each of those scripts builds
# Go binaries, once, from the module pinned in the go.mod beside it (the source comes
# through the Go module proxy into the Go module cache, never into this repository) into
#   ${HAMI_CACHE_DIR:-$HOME/.cache/hami}/<name>-<version>/bin
# with its Go build cache in go-build/ beside bin/.
#
# The sourcing script sets `here` (its own directory) and `set -euo pipefail` first.
# Messages start with "build.sh: " and go to stdout; the bin directory is the last line.

# hack_init MODULE NAME [ARG]: set `version` (MODULE's version in $here/go.mod) and `bindir`
# (the cache directory NAME-<version>/bin). With ARG --print-dir: print bindir, exit 0.
# Exits 1 when go.mod does not require MODULE.
hack_init() {
	local module="$1" name="$2" regex="${1//./\\.}"
	version="$(grep -oE "^\s*(require\s+)?$regex v[0-9][^ ]*" "$here/go.mod" \
		| awk '{print $NF}' || true)"
	if [[ -z "$version" ]]; then
		echo "build.sh: no $module requirement in $here/go.mod" >&2
		exit 1
	fi
	bindir="${HAMI_CACHE_DIR:-$HOME/.cache/hami}/$name-$version/bin"
	if [[ "${3:-}" == "--print-dir" ]]; then
		echo "$bindir"
		exit 0
	fi
}

# hack_have NAME: status 0, saying so, when NAME is already built in $bindir; else 1.
hack_have() {
	[[ -x "$bindir/$1" ]] || return 1
	echo "build.sh: $1 present in $bindir"
}

# hack_all_have NAME...: when every NAME is already built, say so for each and return 0
# (the caller then prints $bindir and exits: no Go needed, no lock waited for); otherwise
# return 1, saying nothing.
hack_all_have() {
	local name
	for name; do [[ -x "$bindir/$name" ]] || return 1; done
	for name; do hack_have "$name"; done
}

# hack_lock: check that Go is on PATH (exit 1 if not), create $bindir and hold its lock on
# fd 9 until the script ends (one build at a time per cache directory: parallel test
# sessions share it), export GOCACHE (beside bin/) and change into $here.
hack_lock() {
	command -v go >/dev/null || { echo "build.sh: needs Go (see go.mod for the version)" >&2; exit 1; }
	mkdir -p "$bindir"
	exec 9>"$bindir/.lock"
	flock 9
	GOCACHE="$(dirname "$bindir")/go-build"
	export GOCACHE
	cd "$here" || exit 1
}

# hack_go_build NAME PACKAGE [FLAG...]: `go build` PACKAGE (CGO off, -trimpath, the FLAGs)
# into $bindir/NAME through a temporary file, so that an interrupted build leaves no
# binary that a later run would take as built. Exits non-zero when the build fails.
hack_go_build() {
	local name="$1" pkg="$2" start=$SECONDS
	shift 2
	echo "build.sh: building $name ($version) from $pkg ..."
	CGO_ENABLED=0 go build -trimpath "$@" -o "$bindir/.$name.tmp" "$pkg"
	mv -f "$bindir/.$name.tmp" "$bindir/$name"
	echo "build.sh: built $name in $((SECONDS - start))s ($(du -h "$bindir/$name" | cut -f1))"
}

# hack_drop_gocache KEEP: remove $GOCACHE (several GiB for Kubernetes) unless KEEP is 1.
hack_drop_gocache() {
	if [[ "${1:-0}" != 1 && -d "$GOCACHE" ]]; then
		echo "build.sh: removing the build cache $GOCACHE ($(du -sh "$GOCACHE" | cut -f1))"
		rm -rf "$GOCACHE"
	fi
}
