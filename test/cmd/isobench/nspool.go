package main

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/isolatord/isolatord/test/sandbox"
)

// nsPool makes network namespaces for benchmark containers without a
// process in them: each is a file under dir with the namespace bind-mounted
// on it (what `ip netns add` does), and isolatord is given its path. For
// 1,000 namespaces this costs about as much kernel time as spawning 1,000
// `sleep infinity` holders (the namespace creation dominates: ~3.5 ms each
// either way on the reference machine), but leaves no process behind and is
// removed with one unmount each.
//
// dir is made a private bind mount of itself, so the thousand mounts do not
// propagate into other mount namespaces.
type nsPool struct {
	dir string

	mu       sync.Mutex
	paths    []string
	ownMount bool
}

func newNSPool(dir string) (*nsPool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &nsPool{dir: dir}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind %s: %w", dir, err)
	}
	p.ownMount = true
	if err := unix.Mount("", dir, "none", unix.MS_PRIVATE, ""); err != nil {
		p.close()
		return nil, fmt.Errorf("make %s private: %w", dir, err)
	}
	return p, nil
}

// create makes a new network namespace bind-mounted at dir/name
// (test/sandbox) and returns the path.
func (p *nsPool) create(name string) (string, error) {
	ns, err := sandbox.CreateNSAt(p.dir, name)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.paths = append(p.paths, ns.Path)
	p.mu.Unlock()
	return ns.Path, nil
}

// remove unmounts and deletes one namespace file.
func (p *nsPool) remove(path string) error {
	err := sandbox.NS{Path: path}.Delete()
	p.mu.Lock()
	for i, q := range p.paths {
		if q == path {
			p.paths = append(p.paths[:i], p.paths[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	return err
}

// close removes every namespace of the pool and the directory's own mount.
func (p *nsPool) close() error {
	errs := []error{p.removeAll()}
	if p.ownMount {
		if err := unix.Unmount(p.dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p.dir, err))
		}
		p.ownMount = false
	}
	return errors.Join(errs...)
}

// removeAll removes every namespace of the pool (the pool stays usable).
func (p *nsPool) removeAll() error {
	p.mu.Lock()
	paths := append([]string(nil), p.paths...)
	p.mu.Unlock()
	var errs []error
	for _, path := range paths {
		if err := p.remove(path); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more", len(errs)-3))
	}
	return errors.Join(errs...)
}
