#!/usr/bin/env bash
# Pin another Kubernetes release for hack/k8s/build.sh: writes versions/<version>/go.mod and
# go.sum (and the three-line etcd main) beside this script, from the release's own go.mod.
#
# Usage: hack/k8s/pin.sh v1.31.14
#
# The module requires k8s.io/kubernetes at <version>, replaces every staging module the
# release's go.mod names (k8s.io/api, ...) with the matching v0.<minor>.<patch> tag, and lets
# `go mod tidy` pick etcd at the version that release requires. Needs the Go module proxy
# (or a warm module cache); run once per release and commit the result.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="${1:?usage: pin.sh v1.<minor>.<patch>}"
[[ "$version" == v* ]] || version="v$version"
if [[ ! "$version" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
	echo "pin.sh: not a Kubernetes release: $version" >&2
	exit 1
fi
staging_version="v0.${version#v1.}"
dir="$here/versions/$version"
mkdir -p "$dir/cmd/etcd"
cp "$here/cmd/etcd/main.go" "$dir/cmd/etcd/main.go"

# The release's go.mod lists its staging modules as `k8s.io/x => ./staging/src/k8s.io/x`.
upstream="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
mapfile -t staging < <(grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$upstream" | awk '{print $1}')
if [[ ${#staging[@]} -eq 0 ]]; then
	echo "pin.sh: no staging modules in $upstream" >&2
	exit 1
fi
# The proxy may lack a staging module at exactly that tag: then the newest earlier patch of
# the same minor stands in (a patch release changes a staging module rarely), said in go.mod.
# Availability is a download, not a listing: the proxy can list a tag (or leave one out of
# its version list) yet refuse its zip (v1.29.6: k8s.io/endpointslice v0.29.6 is listed,
# its zip is 403, v0.29.5 downloads), so earlier patches are tried one by one, newest first.
patch="${version##*.}"
minor="${staging_version%.*}"
available() { go mod download "$1@$2" >/dev/null 2>&1; }
declare -A chosen=()
substituted=()
for module in "${staging[@]}"; do
	if available "$module" "$staging_version"; then
		chosen[$module]="$staging_version"
		continue
	fi
	best=""
	for ((p = patch - 1; p >= 0; p--)); do
		if available "$module" "$minor.$p"; then best="$minor.$p"; break; fi
	done
	if [[ -z "$best" ]]; then
		# the four commands do not import the samples; `go mod tidy` fails if one is needed
		echo "pin.sh: the Go module proxy has no $module $minor.x at or before $staging_version; left out"
		continue
	fi
	chosen[$module]="$best"
	substituted+=("$module $best")
done
{
	echo "// Kubernetes $version for hack/k8s/build.sh K8S_VERSION=$version (written by hack/k8s/pin.sh)."
	echo "module hami.local/hack/k8s"
	echo
	echo "go 1.26.0"
	echo
	echo "require k8s.io/kubernetes $version"
	echo
	for s in "${substituted[@]}"; do
		echo "// The Go module proxy has no ${s% *} $staging_version: ${s#* } (same minor) stands in."
	done
	echo "replace ("
	for module in "${staging[@]}"; do
		[[ -z "${chosen[$module]:-}" ]] || echo "	$module => $module ${chosen[$module]}"
	done
	echo ")"
	echo
	echo "tool ("
	for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
		echo "	k8s.io/kubernetes/cmd/$cmd"
	done
	echo ")"
} > "$dir/go.mod"
cd "$dir"
go mod tidy
echo "pin.sh: pinned $version in $dir"
