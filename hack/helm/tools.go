//go:build tools

// Package tools pins the helm CLI so that `go build helm.sh/helm/v3/cmd/helm` resolves
// from this module's go.mod; no helm code lives in this repository.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
