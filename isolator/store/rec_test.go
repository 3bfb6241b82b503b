package store

import (
	"errors"
	"io"
	"log/slog"
)

// rec is the record the tests store: the fields of the lifecycle's that
// matter here.
type rec struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Slot  uint16 `json:"slot,omitempty"`
	Veth  string `json:"veth,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
}

const (
	statePrepared  = "prepared"
	stateIsolating = "isolating"
	stateIsolated  = "isolated"
	stateCleaning  = "cleaning"
)

func (r *rec) Key() string          { return r.ID }
func (r *rec) Sequence() uint64     { return r.Seq }
func (r *rec) SetSequence(n uint64) { r.Seq = n }
func (r *rec) LoadAlone() bool      { return r.State == statePrepared || r.State == stateIsolating }
func quietLogger() *slog.Logger     { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func openStore(dir string, log *slog.Logger) (*Store[rec, *rec], error) {
	return Open[rec](dir, log, validKey)
}

// validKey refuses what the lifecycle's container IDs never are.
func validKey(id string) error {
	if id == "" || id[0] == '.' {
		return errors.New("bad key")
	}
	return nil
}
