package main

import "github.com/isolatord/isolatord/cmd/internal/buildinfo"

// The version make build stamps, else the one the Go build recorded.
func init() { version = buildinfo.Version(version) }
