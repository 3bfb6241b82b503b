package main

import "github.com/isolatord/isolatord/buildinfo"

// The version make build stamps, else the one the Go build recorded.
func init() { version = buildinfo.Version(version) }
