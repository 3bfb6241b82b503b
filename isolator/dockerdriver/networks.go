package dockerdriver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// networks are the Docker networks of this driver, persisted in a JSON file
// (Docker does not replay CreateNetwork to a plugin after a restart of
// either): network ID -> its -o options.
type networks struct {
	path string
	mu   sync.Mutex
	m    map[string]map[string]string
}

type networksFile struct {
	Networks map[string]map[string]string `json:"networks"`
}

// loadNetworks reads the networks file at path (missing: none).
func loadNetworks(path string) (*networks, error) {
	n := &networks{path: path, m: map[string]map[string]string{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return n, nil
	}
	if err != nil {
		return nil, err
	}
	var f networksFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for id, o := range f.Networks {
		if o == nil {
			o = map[string]string{}
		}
		n.m[id] = o
	}
	return n, nil
}

func (n *networks) get(id string) (map[string]string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	o, ok := n.m[id]
	return o, ok
}

// put adds or replaces network id and writes the file; on a failed write
// nothing changes.
func (n *networks) put(id string, opts map[string]string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev, had := n.m[id]
	n.m[id] = opts
	if err := n.save(); err != nil {
		if had {
			n.m[id] = prev
		} else {
			delete(n.m, id)
		}
		return err
	}
	return nil
}

// remove deletes network id and writes the file.
func (n *networks) remove(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev, had := n.m[id]
	if !had {
		return nil
	}
	delete(n.m, id)
	if err := n.save(); err != nil {
		n.m[id] = prev
		return err
	}
	return nil
}

// save writes the file atomically (a temporary file renamed over it),
// with n.mu held.
func (n *networks) save() error {
	b, err := json.MarshalIndent(networksFile{Networks: n.m}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(n.path), 0o700); err != nil {
		return err
	}
	tmp := n.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, n.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save Docker networks to %s: %w", n.path, err)
	}
	return nil
}
