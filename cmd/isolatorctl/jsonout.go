package main

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// jsonOf is the value printed with -o json for a response message: one
// generic mapping of the proto, so a new field shows up without an edit
// here. It differs from protojson where scripts want plain JSON:
//   - keys are the proto's own field names (snake_case), every field present;
//   - 64-bit integers are JSON numbers, not strings;
//   - an enum value is its name without the enum's prefix, in lower case
//     (CONTAINER_STATE_ISOLATED: "isolated");
//   - a Timestamp is RFC 3339 in UTC, and the key is left out when unset
//     (an event that has not happened);
//   - an unset message field is null; unset lists and maps are [] and {}.
//
// A nil top-level message prints as an object of its fields' zero values.
func jsonOf(m proto.Message) map[string]any {
	return fieldsJSON(m.ProtoReflect())
}

func fieldsJSON(m protoreflect.Message) map[string]any {
	out := map[string]any{}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		v := m.Get(fd)
		if fd.Message() != nil && fd.Message().FullName() == timestampName && !fd.IsList() && !fd.IsMap() && !m.Has(fd) {
			continue
		}
		out[string(fd.Name())] = fieldJSON(fd, v)
	}
	return out
}

const timestampName = "google.protobuf.Timestamp"

func fieldJSON(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch {
	case fd.IsList():
		l := v.List()
		out := make([]any, 0, l.Len())
		for i := 0; i < l.Len(); i++ {
			out = append(out, singularJSON(fd, l.Get(i)))
		}
		return out
	case fd.IsMap():
		out := map[string]any{}
		v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			out[k.String()] = singularJSON(fd.MapValue(), v)
			return true
		})
		return out
	}
	return singularJSON(fd, v)
}

func singularJSON(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		return enumJSON(fd.Enum(), v.Enum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		m := v.Message()
		if !m.IsValid() {
			return nil
		}
		if ts, ok := m.Interface().(*timestamppb.Timestamp); ok {
			return ts.AsTime().UTC().Format(time.RFC3339Nano)
		}
		return fieldsJSON(m)
	}
	return v.Interface()
}

// enumJSON is "isolated" for CONTAINER_STATE_ISOLATED of ContainerState, or
// "unknown(N)" for a number the enum does not name.
func enumJSON(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	vd := ed.Values().ByNumber(n)
	if vd == nil {
		return fmt.Sprintf("unknown(%d)", int32(n))
	}
	return strings.ToLower(strings.TrimPrefix(string(vd.Name()), upperSnake(string(ed.Name()))+"_"))
}

// upperSnake is "CONTAINER_STATE" for "ContainerState".
func upperSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}
