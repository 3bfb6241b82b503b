package store

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync makes f's data durable (fdatasync(2): its metadata only as far
// as needed to read the data back), retrying when interrupted.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	cerr := rc.Control(func(fd uintptr) {
		for {
			if err = unix.Fdatasync(int(fd)); err != unix.EINTR {
				return
			}
		}
	})
	return errors.Join(cerr, err)
}
