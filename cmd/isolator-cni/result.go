package main

import (
	"encoding/json"
	"io"
	"net"
	"strings"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// printResult writes r as r.PrintTo does. A 1.x result's encoding
// (types100.Result.MarshalJSON) encodes the struct, decodes that into
// generic values and encodes those again (to leave out an empty dns), so
// its objects come out with their keys sorted and its numbers as float64;
// resultValue builds those generic values from the fields directly, for
// the same bytes without the round trip, which costs a freshly started
// plugin more than the rest of its result. Other versions print as they
// do.
func printResult(w io.Writer, r types.Result) error {
	r100, ok := r.(*types100.Result)
	if !ok {
		return r.PrintTo(w)
	}
	b, err := json.MarshalIndent(resultValue(r100), "", "    ")
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// resultValue is what json.Unmarshal gives of r's encoding into an any.
func resultValue(r *types100.Result) map[string]any {
	m := map[string]any{}
	if r.CNIVersion != "" {
		m["cniVersion"] = r.CNIVersion
	}
	if len(r.Interfaces) > 0 {
		m["interfaces"] = objects(r.Interfaces, func(ifc *types100.Interface) map[string]any {
			o := map[string]any{"name": text(ifc.Name)}
			putString(o, "mac", ifc.Mac)
			putNumber(o, "mtu", ifc.Mtu)
			putString(o, "sandbox", ifc.Sandbox)
			putString(o, "socketPath", ifc.SocketPath)
			putString(o, "pciID", ifc.PciID)
			return o
		})
	}
	if len(r.IPs) > 0 {
		m["ips"] = objects(r.IPs, func(ip *types100.IPConfig) map[string]any {
			o := map[string]any{"address": ipNetString(ip.Address)}
			putIndex(o, "interface", ip.Interface)
			putIP(o, "gateway", ip.Gateway)
			return o
		})
	}
	if len(r.Routes) > 0 {
		m["routes"] = objects(r.Routes, func(rt *types.Route) map[string]any {
			o := map[string]any{"dst": ipNetString(rt.Dst)}
			putIP(o, "gw", rt.GW)
			putNumber(o, "mtu", rt.MTU)
			putNumber(o, "advmss", rt.AdvMSS)
			putNumber(o, "priority", rt.Priority)
			putIndex(o, "table", rt.Table)
			putIndex(o, "scope", rt.Scope)
			return o
		})
	}
	if d := r.DNS; !d.IsEmpty() {
		o := map[string]any{}
		putStrings(o, "nameservers", d.Nameservers)
		putString(o, "domain", d.Domain)
		putStrings(o, "search", d.Search)
		putStrings(o, "options", d.Options)
		m["dns"] = o
	}
	return m
}

// objects is the generic value of a list of structs: obj of each, nil for
// a nil one.
func objects[T any](xs []*T, obj func(*T) map[string]any) []any {
	l := make([]any, len(xs))
	for i, x := range xs {
		if x != nil {
			l[i] = obj(x)
		}
	}
	return l
}

// The put functions set what a field tagged omitempty decodes to, or
// nothing when it is left out.

func putString(o map[string]any, k, v string) {
	if v != "" {
		o[k] = text(v)
	}
}

func putNumber(o map[string]any, k string, v int) {
	if v != 0 {
		o[k] = float64(v)
	}
}

func putIndex(o map[string]any, k string, v *int) {
	if v != nil {
		o[k] = float64(*v)
	}
}

func putIP(o map[string]any, k string, ip net.IP) {
	if len(ip) > 0 {
		o[k] = ip.String()
	}
}

func putStrings(o map[string]any, k string, v []string) {
	if len(v) > 0 {
		l := make([]any, len(v))
		for i, s := range v {
			l[i] = text(s)
		}
		o[k] = l
	}
}

// text is s as encoding and decoding it gives it back: each byte that is
// not UTF-8 replaced by U+FFFD.
func text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// ipNetString is types.IPNet's encoding of n.
func ipNetString(n net.IPNet) string { return n.String() }
