package isolator

// Spare files of the intent journal. Every isolate and every cleanup of an
// isolated container writes an intent and removes it once the outcome is
// committed: created and deleted, each intent would cost the file system
// an inode allocation, which on ext4 scans the inode bitmap past every
// recently deleted inode (recently_deleted, find_inode_bit), a cost that
// grows with the churn of containers and sat on Isolate's answer path. So
// the journal recycles its files: a removed intent's file is renamed to a
// spare name (sparePrefix) instead of being deleted, and a new intent is
// written into a spare, then renamed into place. When the container has an
// intent already, the spare and the intent are exchanged in one rename
// (RENAME_EXCHANGE where the file system has it), so the displaced intent
// becomes the spare; no inode is freed either way.
//
// A spare's content is an old intent under a name the journal never reads
// as one (container IDs never start with a dot); a kill between writing a
// spare and renaming it into place leaves the earlier state of the journal,
// as a kill before the write would. Spares left by an earlier run are
// removed when the journal is opened.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// sparePrefix starts the name of a spare file.
const sparePrefix = ".spare-"

// maxSpares bounds the spare files kept (a drain clears hundreds of
// intents at once; the files beyond this are deleted).
const maxSpares = 64

// takeSpare returns the path of a spare file holding b (a new one when the
// pool is empty).
func (l *intentLog) takeSpare(b []byte) (string, error) {
	l.mu.Lock()
	var path string
	if n := len(l.spares); n > 0 {
		path = l.spares[n-1]
		l.spares = l.spares[:n-1]
	}
	l.mu.Unlock()
	if path != "" {
		if err := overwrite(path, b); err == nil {
			return path, nil
		}
		os.Remove(path) // it cannot be reused: a new one below
	}
	path = l.newSpareName()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		os.Remove(path)
		return "", err
	}
	return path, nil
}

// newSpareName returns a spare name not used yet by this journal.
func (l *intentLog) newSpareName() string {
	l.mu.Lock()
	l.lastSpare++
	n := l.lastSpare
	l.mu.Unlock()
	return filepath.Join(l.dir, sparePrefix+strconv.FormatUint(n, 10))
}

// putSpare keeps path as a spare, or deletes it when the pool is full.
func (l *intentLog) putSpare(path string) {
	l.mu.Lock()
	keep := len(l.spares) < maxSpares
	if keep {
		l.spares = append(l.spares, path)
	}
	l.mu.Unlock()
	if !keep {
		os.Remove(path)
	}
}

// place renames spare to path, the intent file of a container; when had is
// true (path exists), the two are exchanged and the displaced intent is
// kept as a spare.
func (l *intentLog) place(spare, path string, had bool) error {
	if had {
		err := exchange(spare, path)
		if err == nil {
			l.putSpare(spare)
			return nil
		}
		if !errors.Is(err, errNoExchange) && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return os.Rename(spare, path)
}

// retire moves the intent file path out of the journal: it becomes a
// spare (or is deleted when the pool is full).
func (l *intentLog) retire(path string) error {
	l.mu.Lock()
	full := len(l.spares) >= maxSpares
	l.mu.Unlock()
	if full {
		return os.Remove(path)
	}
	spare := l.newSpareName()
	if err := os.Rename(path, spare); err != nil {
		return err
	}
	l.putSpare(spare)
	return nil
}

// overwrite replaces the content of the existing file path by b (no inode
// allocated for a small intent). The file is truncated to nothing first,
// as a fresh file would be: after a power loss that keeps the rename that
// follows but not these bytes, the file is empty (read as no intent), never
// an older intent of another container written into the spare before.
func overwrite(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("spare %s: %w", filepath.Base(path), err)
	}
	return nil
}
