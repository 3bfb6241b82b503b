package liteclient

import (
	"errors"
	"slices"
	"unicode/utf8"
)

// The encoders write fields in field-number order (a oneof's member last)
// and leave out zero scalars, as the generated code does; map entries
// carry key and value even when empty, and go out sorted by key (what the
// generated code's deterministic marshalling gives).

func appendString(b []byte, num number, s string) []byte {
	if s == "" {
		return b
	}
	return appendStringAlways(b, num, s)
}

// appendStringAlways writes s even when empty: a oneof member or a map
// entry's key or value.
func appendStringAlways(b []byte, num number, s string) []byte {
	b = appendTag(b, num, bytesType)
	return appendBytesValue(b, []byte(s))
}

func appendVarint(b []byte, num number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, varintType)
	return appendVarintValue(b, v)
}

func appendBool(b []byte, num number, v bool) []byte {
	if !v {
		return b
	}
	return appendVarint(b, num, 1)
}

func appendMessage(b []byte, num number, m []byte) []byte {
	b = appendTag(b, num, bytesType)
	return appendBytesValue(b, m)
}

func appendStringMap(b []byte, num number, m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var e []byte
	for _, k := range keys {
		e = appendStringAlways(e[:0], 1, k)
		e = appendStringAlways(e, 2, m[k])
		b = appendMessage(b, num, e)
	}
	return b
}

// errInvalidUTF8 is what the generated code says of such a string.
var errInvalidUTF8 = errors.New("string field contains invalid UTF-8")

// decodeFields calls field for each field of the message m. field returns
// the number of bytes of the field's value it consumed, or -1 when it does
// not know the field (or its wire type), which is then skipped, as the
// generated code skips unknown fields.
func decodeFields(m []byte, field func(num number, typ wireType, v []byte) (int, error)) error {
	for len(m) > 0 {
		num, typ, n := tag(m)
		if n < 0 {
			return errWire
		}
		m = m[n:]
		used, err := field(num, typ, m)
		if err != nil {
			return err
		}
		if used < 0 {
			used = skip(num, typ, m, recursionLimit)
			if used < 0 {
				return errWire
			}
		}
		m = m[used:]
	}
	return nil
}

// consumeVarint reads a varint field's value.
func consumeVarint(v []byte) (uint64, int, error) {
	x, n := varint(v)
	if n < 0 {
		return 0, 0, errWire
	}
	return x, n, nil
}

// consumeBytes reads a length-delimited field's value.
func consumeBytes(v []byte) ([]byte, int, error) {
	x, n := lengthDelimited(v)
	if n < 0 {
		return nil, 0, errWire
	}
	return x, n, nil
}

// consumeString reads a string field's value, which must be UTF-8.
func consumeString(v []byte) (string, int, error) {
	x, n, err := consumeBytes(v)
	if err != nil {
		return "", 0, err
	}
	if !utf8.Valid(x) {
		return "", 0, errInvalidUTF8
	}
	return string(x), n, nil
}

// decodeStringMapEntry adds one map<string, string> entry to *m.
func decodeStringMapEntry(v []byte, m *map[string]string) (int, error) {
	e, n, err := consumeBytes(v)
	if err != nil {
		return 0, err
	}
	var key, val string
	err = decodeFields(e, func(num number, typ wireType, v []byte) (int, error) {
		if typ != bytesType || (num != 1 && num != 2) {
			return -1, nil
		}
		s, n, err := consumeString(v)
		if num == 1 {
			key = s
		} else {
			val = s
		}
		return n, err
	})
	if err != nil {
		return 0, err
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[key] = val
	return n, nil
}
