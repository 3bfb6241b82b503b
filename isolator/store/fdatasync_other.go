//go:build !linux

package store

import "os"

// fdatasync makes f's data durable (fsync where fdatasync(2) is missing).
func fdatasync(f *os.File) error { return f.Sync() }
