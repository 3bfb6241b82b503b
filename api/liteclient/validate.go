package liteclient

import (
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/isolatord/isolatord/api/unarygrpc"
)

// A request whose string field is not UTF-8 is refused before it is sent,
// as the generated code refuses to encode it: the error, INVALID_ARGUMENT,
// names the field.

// invalidUTF8 is the error for the request field named field.
func invalidUTF8(field string) error {
	return &unarygrpc.Error{Code: unarygrpc.InvalidArgument, Message: field + ": " + errInvalidUTF8.Error() + " (the request was not sent)"}
}

// checkString checks one string field.
func checkString(field, s string) error {
	if utf8.ValidString(s) {
		return nil
	}
	return invalidUTF8(field)
}

// checkStringMap checks a map's keys and values, in key order.
func checkStringMap(field string, m map[string]string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !utf8.ValidString(k) {
			return invalidUTF8(field + " key " + strconv.Quote(k))
		}
		if !utf8.ValidString(m[k]) {
			return invalidUTF8(field + "[" + strconv.Quote(k) + "]")
		}
	}
	return nil
}

// check refuses a request with a string that is not UTF-8.
func (r *AttachRequest) check() error {
	if p := r.Prepare; p != nil {
		if err := checkString("prepare.container_id", p.ContainerID); err != nil {
			return err
		}
		if err := checkStringMap("prepare.labels", p.Labels); err != nil {
			return err
		}
	}
	if err := checkString("netns_path", r.NetnsPath); err != nil {
		return err
	}
	return checkStringMap("require_labels", r.RequireLabels)
}

func (r *CleanupRequest) check() error {
	if err := checkString("container_id", r.ContainerID); err != nil {
		return err
	}
	return checkStringMap("require_labels", r.RequireLabels)
}

func (r *GetRequest) check() error { return checkString("container_id", r.ContainerID) }
