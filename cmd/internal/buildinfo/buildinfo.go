// Package buildinfo tells which version of isolatord a binary is: the
// version stamped at link time (make build sets it from git describe), else
// what the Go toolchain recorded (the module version, or the VCS revision
// of a build from a checkout), else "dev".
package buildinfo

import "runtime/debug"

// Version returns stamped when it is set (not "" or "dev"), else the
// version the Go build information carries.
func Version(stamped string) string {
	if stamped != "" && stamped != "dev" {
		return stamped
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	return fromBuildInfo(bi)
}

// fromBuildInfo: the main module's version when it is a real one, else the
// VCS revision (12 digits, "-dirty" when the tree had changes), else "dev".
func fromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
