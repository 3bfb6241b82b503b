package main

import (
	"fmt"
	"strconv"

	"github.com/isolatord/isolatord/dataplane"
)

// ipv6Flag is --ipv6: a boolean flag with a third, default state "auto"
// (on when the host interface has a global IPv6 address). "--ipv6" alone
// is --ipv6=true.
type ipv6Flag struct{ mode dataplane.IPv6Mode }

func (f *ipv6Flag) String() string {
	if f == nil {
		return "auto"
	}
	switch f.mode {
	case dataplane.IPv6On:
		return "true"
	case dataplane.IPv6Off:
		return "false"
	}
	return "auto"
}

func (f *ipv6Flag) Set(s string) error {
	if s == "auto" {
		f.mode = dataplane.IPv6Auto
		return nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q: want true, false or auto", s)
	}
	f.mode = dataplane.IPv6Off
	if on {
		f.mode = dataplane.IPv6On
	}
	return nil
}

// IsBoolFlag lets "--ipv6" stand for "--ipv6=true".
func (f *ipv6Flag) IsBoolFlag() bool { return true }
