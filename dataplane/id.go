package dataplane

import "github.com/isolatord/isolatord/isolator/plane"

// Container IDs and veth names (see package plane).
var (
	ErrHostNamespace = plane.ErrHostNamespace
	ValidateID       = plane.ValidateID
	VethName         = plane.VethName
)

// Naming bounds (see package plane).
const (
	VethPrefix  = plane.VethPrefix
	MaxIDLength = plane.MaxIDLength
)
