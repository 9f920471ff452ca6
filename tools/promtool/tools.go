//go:build tools

// Package tools records the command this module builds. To move the pin: `go get
// github.com/prometheus/prometheus@vX`, then `tools/build.sh promtool` (its `go build -mod=mod
// -tags remove_all_sd` fills go.sum). `go mod tidy` does not work here: it also wants the modules
// of the service-discovery plugins the build leaves out, and the proxy does not serve nomad's.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
