package plane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// VethPrefix starts every host-side veth name isolatord creates.
const VethPrefix = "iso"

// MaxIDLength is the longest container ID accepted.
const MaxIDLength = 128

// ValidateID checks a container ID before it is used in paths and names:
// 1-128 characters from [A-Za-z0-9_.-], starting with a letter or digit.
func ValidateID(id string) error {
	if id == "" {
		return errors.New("must not be empty")
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("%d characters, at most %d allowed", len(id), MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i > 0 {
			ok = ok || c == '_' || c == '.' || c == '-'
		}
		if !ok {
			return fmt.Errorf("%q: character %q at position %d is not allowed (use letters, digits, '_', '.', '-'; start with a letter or digit)", id, c, i)
		}
	}
	return nil
}

// VethName is the host-side veth name of a container: "iso" + the first 12
// hex digits of the SHA-256 of its ID (15 characters, within IFNAMSIZ), so a
// restarted daemon maps veths back to containers and recognises strays.
func VethName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return VethPrefix + hex.EncodeToString(sum[:])[:12]
}
