//go:build tools

// Package tools records the command this module builds, so `go mod tidy` keeps its requirements.
// To move the pin: `go get helm.sh/helm/v4@vX && go mod tidy`.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
