package liteclient

import "errors"

// The protobuf wire format (protobuf.dev/programming-guides/encoding), the
// part these messages use. It is written here rather than taken from
// google.golang.org/protobuf/encoding/protowire because that package brings
// protobuf's internal/detrand, whose initialisation opens and reads the
// running executable: before every call of a program that runs once per
// call. The tests check every encoding against the generated code.

// number is a field number, wireType a field's wire type.
type (
	number   int32
	wireType int8
)

const (
	varintType     wireType = 0
	fixed64Type    wireType = 1
	bytesType      wireType = 2
	startGroupType wireType = 3
	endGroupType   wireType = 4
	fixed32Type    wireType = 5
)

// maxNumber is the largest valid field number.
const maxNumber = 1<<29 - 1

// recursionLimit bounds nested groups in skipped fields, as the generated
// code's decoder bounds them.
const recursionLimit = 10000

// errWire is the error for bytes that are not valid wire format.
var errWire = errors.New("invalid protobuf wire format")

func appendVarintValue(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendTag(b []byte, num number, typ wireType) []byte {
	return appendVarintValue(b, uint64(num)<<3|uint64(typ))
}

func appendBytesValue(b []byte, v []byte) []byte {
	b = appendVarintValue(b, uint64(len(v)))
	return append(b, v...)
}

// varint reads a varint: its value and length, or a negative length.
func varint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		c := b[i]
		if i == 9 && c > 1 {
			return 0, -1 // more than 64 bits
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
	return 0, -1
}

// tag reads a field's tag.
func tag(b []byte) (number, wireType, int) {
	v, n := varint(b)
	if n < 0 || v>>3 < 1 || v>>3 > maxNumber {
		return 0, 0, -1
	}
	return number(v >> 3), wireType(v & 7), n
}

// lengthDelimited reads a length-delimited value: its bytes and the length
// of the whole.
func lengthDelimited(b []byte) ([]byte, int) {
	m, n := varint(b)
	if n < 0 || m > uint64(len(b)-n) {
		return nil, -1
	}
	return b[n : n+int(m)], n + int(m)
}

// skip reads past the value of a field of type typ (a group up to its end,
// depth groups deep at most), returning its length or a negative one.
func skip(num number, typ wireType, b []byte, depth int) int {
	switch typ {
	case varintType:
		_, n := varint(b)
		return n
	case fixed32Type:
		if len(b) < 4 {
			return -1
		}
		return 4
	case fixed64Type:
		if len(b) < 8 {
			return -1
		}
		return 8
	case bytesType:
		_, n := lengthDelimited(b)
		return n
	case startGroupType:
		if depth <= 0 {
			return -1
		}
		for i := 0; ; {
			n2, t2, n := tag(b[i:])
			if n < 0 {
				return -1
			}
			i += n
			if t2 == endGroupType {
				if n2 != num {
					return -1
				}
				return i
			}
			n = skip(n2, t2, b[i:], depth-1)
			if n < 0 {
				return -1
			}
			i += n
		}
	}
	return -1 // an end group without its start, or a reserved type
}
