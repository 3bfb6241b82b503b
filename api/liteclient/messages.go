package liteclient

import (
	"fmt"
)

// The messages below are the Isolator service's (api/isolatord/v1), cut
// to the fields the CNI plugin sends and reads; field numbers and
// encodings are the .proto's. A decoder skips every other field, as the
// generated code skips unknown ones.

// ContainerState is isolator.proto's ContainerState.
type ContainerState int32

// The container states.
const (
	StateUnspecified ContainerState = 0
	StatePrepared    ContainerState = 1
	StateIsolated    ContainerState = 2
)

// StateName is the lower-case name of a container state, as clients show
// it: "prepared", "isolated" ("unspecified", or "unknown(N)" for a state
// this client does not know).
func StateName(s ContainerState) string {
	switch s {
	case StateUnspecified:
		return "unspecified"
	case StatePrepared:
		return "prepared"
	case StateIsolated:
		return "isolated"
	}
	return fmt.Sprintf("unknown(%d)", int32(s))
}

// PortRange is a range of static ports, begin to end inclusive.
type PortRange struct {
	Begin, End uint32 // 1, 2
	Shared     bool   // 3
}

func (p *PortRange) marshal(b []byte) []byte {
	b = appendVarint(b, 1, uint64(p.Begin))
	b = appendVarint(b, 2, uint64(p.End))
	return appendBool(b, 3, p.Shared)
}

func (p *PortRange) unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		if typ != varintType || num < 1 || num > 3 {
			return -1, nil
		}
		x, n, err := consumeVarint(v)
		switch num {
		case 1:
			p.Begin = uint32(x)
		case 2:
			p.End = uint32(x)
		case 3:
			p.Shared = x != 0
		}
		return n, err
	})
}

// Container is what isolatord holds for a container (the fields the
// plugin reads).
type Container struct {
	ContainerID string            // 1
	State       ContainerState    // 2
	Ports       []PortRange       // 4
	Veth        string            // 5
	NetnsSource string            // 8
	Labels      map[string]string // 11
}

func (c *Container) unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		switch {
		case num == 2 && typ == varintType:
			x, n, err := consumeVarint(v)
			c.State = ContainerState(int32(x))
			return n, err
		case typ != bytesType:
			return -1, nil
		}
		switch num {
		case 1, 5, 8:
			s, n, err := consumeString(v)
			switch num {
			case 1:
				c.ContainerID = s
			case 5:
				c.Veth = s
			case 8:
				c.NetnsSource = s
			}
			return n, err
		case 4:
			e, n, err := consumeBytes(v)
			if err != nil {
				return 0, err
			}
			var p PortRange
			if err := p.unmarshal(e); err != nil {
				return 0, err
			}
			c.Ports = append(c.Ports, p)
			return n, nil
		case 11:
			return decodeStringMapEntry(v, &c.Labels)
		}
		return -1, nil
	})
}

// unmarshalContainer decodes a Container field's value into *c (merging
// into one already there, as the generated code does).
func unmarshalContainer(v []byte, c **Container) (int, error) {
	e, n, err := consumeBytes(v)
	if err != nil {
		return 0, err
	}
	if *c == nil {
		*c = &Container{}
	}
	return n, (*c).unmarshal(e)
}

// PrepareRequest reserves a container's ports (no bandwidth limits: the
// daemon's defaults apply).
type PrepareRequest struct {
	ContainerID string            // 1
	Ports       []PortRange       // 2
	Labels      map[string]string // 10
}

func (r *PrepareRequest) marshal(b []byte) []byte {
	b = appendString(b, 1, r.ContainerID)
	for i := range r.Ports {
		b = appendMessage(b, 2, r.Ports[i].marshal(nil))
	}
	return appendStringMap(b, 10, r.Labels)
}

// AttachRequest is Prepare then Isolate in the namespace at NetnsPath.
type AttachRequest struct {
	Prepare *PrepareRequest // 1
	// NetnsPath is the oneof target's netns_path (3), always sent.
	NetnsPath     string
	RequireLabels map[string]string // 4
}

// Marshal encodes the request. The generated code writes a oneof's member
// after the other fields, whatever its number; so does Marshal.
func (r *AttachRequest) Marshal() []byte {
	var b []byte
	if r.Prepare != nil {
		b = appendMessage(b, 1, r.Prepare.marshal(nil))
	}
	b = appendStringMap(b, 4, r.RequireLabels)
	return appendStringAlways(b, 3, r.NetnsPath)
}

// AttachResponse is the container after Attach.
type AttachResponse struct {
	Container    *Container // 1
	WasIsolated  bool       // 2
	LabelsDiffer bool       // 3
	// Eth0 is the container's interface; nil from a daemon that does not
	// send it (or when the container was not isolated).
	Eth0 *Interface // 4
}

// Interface is AttachResponse.Interface: the container's eth0 as the
// daemon configured it.
type Interface struct {
	MAC           string   // 1
	MTU           uint32   // 2
	IPv4Addresses []string // 3
	IPv4Gateway   string   // 4
	IPv6Addresses []string // 5
	IPv6Gateway   string   // 6
}

func (e *Interface) unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		switch {
		case num == 2 && typ == varintType:
			x, n, err := consumeVarint(v)
			e.MTU = uint32(x)
			return n, err
		case typ != bytesType || num < 1 || num > 6:
			return -1, nil
		case num == 2:
			return -1, nil
		}
		s, n, err := consumeString(v)
		switch num {
		case 1:
			e.MAC = s
		case 3:
			e.IPv4Addresses = append(e.IPv4Addresses, s)
		case 4:
			e.IPv4Gateway = s
		case 5:
			e.IPv6Addresses = append(e.IPv6Addresses, s)
		case 6:
			e.IPv6Gateway = s
		}
		return n, err
	})
}

// Unmarshal decodes the reply into r.
func (r *AttachResponse) Unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		switch {
		case num == 1 && typ == bytesType:
			return unmarshalContainer(v, &r.Container)
		case num == 4 && typ == bytesType:
			e, n, err := consumeBytes(v)
			if err != nil {
				return 0, err
			}
			if r.Eth0 == nil {
				r.Eth0 = &Interface{}
			}
			return n, r.Eth0.unmarshal(e)
		case (num == 2 || num == 3) && typ == varintType:
			x, n, err := consumeVarint(v)
			if num == 2 {
				r.WasIsolated = x != 0
			} else {
				r.LabelsDiffer = x != 0
			}
			return n, err
		}
		return -1, nil
	})
}

// CleanupRequest removes a container, only if it carries RequireLabels
// when they are set.
type CleanupRequest struct {
	ContainerID   string            // 1
	RequireLabels map[string]string // 50
}

// Marshal encodes the request.
func (r *CleanupRequest) Marshal() []byte {
	b := appendString(nil, 1, r.ContainerID)
	return appendStringMap(b, 50, r.RequireLabels)
}

// CleanupResponse says whether the container was kept (it lacked one of
// the required labels).
type CleanupResponse struct {
	Kept bool // 50
}

// Unmarshal decodes the reply into r.
func (r *CleanupResponse) Unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		if num != 50 || typ != varintType {
			return -1, nil
		}
		x, n, err := consumeVarint(v)
		r.Kept = x != 0
		return n, err
	})
}

// GetRequest asks for one container.
type GetRequest struct {
	ContainerID string // 1
}

// Marshal encodes the request.
func (r *GetRequest) Marshal() []byte { return appendString(nil, 1, r.ContainerID) }

// GetResponse is one container.
type GetResponse struct {
	Container *Container // 1
}

// Unmarshal decodes the reply into r.
func (r *GetResponse) Unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		if num != 1 || typ != bytesType {
			return -1, nil
		}
		return unmarshalContainer(v, &r.Container)
	})
}

// ListResponse is every container.
type ListResponse struct {
	Containers []*Container // 1
}

// Unmarshal decodes the reply into r.
func (r *ListResponse) Unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		if num != 1 || typ != bytesType {
			return -1, nil
		}
		var c *Container
		n, err := unmarshalContainer(v, &c)
		r.Containers = append(r.Containers, c)
		return n, err
	})
}

// StatusResponse describes the daemon (the fields the plugin reads).
type StatusResponse struct {
	Version string // 1
	HostIP  string // 13
}

// Unmarshal decodes the reply into r.
func (r *StatusResponse) Unmarshal(m []byte) error {
	return decodeFields(m, func(num number, typ wireType, v []byte) (int, error) {
		if (num != 1 && num != 13) || typ != bytesType {
			return -1, nil
		}
		s, n, err := consumeString(v)
		if num == 1 {
			r.Version = s
		} else {
			r.HostIP = s
		}
		return n, err
	})
}
