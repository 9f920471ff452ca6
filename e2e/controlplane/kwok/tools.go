//go:build tools

// Package tools records the command this module builds, so 'go mod tidy' keeps its requirements.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
