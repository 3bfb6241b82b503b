package isolator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The store is an embedded bbolt database in the state directory holding one
// JSON record per container. Every lifecycle step writes the record before it
// touches the kernel (the intent: a transitional state) and again after (the
// outcome), so a daemon killed at any point finds, for each container, either a
// stable state or an intent that recovery completes or rolls back.

var (
	bucketContainers = []byte("containers")
	bucketMeta       = []byte("meta")
)

const schemaVersion = "1"

type store struct {
	db *bolt.DB
}

func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "isolatord.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true})
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w (is another isolatord running?)", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketContainers); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get([]byte("schema")); v != nil && string(v) != schemaVersion {
			return fmt.Errorf("state schema %q, this isolatord understands %q", v, schemaVersion)
		}
		return meta.Put([]byte("schema"), []byte(schemaVersion))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %s: %w", path, err)
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

// put writes one record.
func (s *store) put(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).Put([]byte(r.ID), b)
	})
}

// del removes one record; removing a missing record is not an error.
func (s *store) del(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).Delete([]byte(id))
	})
}

// load returns every record.
func (s *store) load() ([]*Record, error) {
	var out []*Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketContainers).ForEach(func(k, v []byte) error {
			r := new(Record)
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}
