package main

import "github.com/isolatord/isolatord/cmd/internal/buildinfo"

// version is set at build time with -ldflags "-X main.version=..." (make
// build does); otherwise the version the Go build recorded is used.
var version = "dev"

func init() { version = buildinfo.Version(version) }
