//go:build tools

// Package tools records the command this module builds, so `go mod tidy` keeps its requirements.
// To move the pin: `go get github.com/NVIDIA/k8s-device-plugin@vX && go mod tidy`.
package tools

import _ "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery"
