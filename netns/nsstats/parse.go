package nsstats

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// parseSockstat returns the key/value pairs of the line of proto ("TCP",
// "TCP6") in a sockstat file, e.g. "TCP: inuse 3 orphan 0 tw 1 alloc 4 mem 1"
// gives {inuse:3 orphan:0 tw:1 alloc:4 mem:1}.
func parseSockstat(b []byte, proto string) (map[string]uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if len(f)%2 != 1 {
			return nil, fmt.Errorf("malformed %s line %q", proto, sc.Text())
		}
		out := make(map[string]uint64, len(f)/2)
		for i := 1; i+1 < len(f); i += 2 {
			v, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", proto, f[i], err)
			}
			out[f[i]] = v
		}
		return out, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %s line", proto)
}

// parseSNMP parses /proc/net/snmp: for each group a line of counter names
// followed by a line of values, both prefixed with "Group:". Negative values
// (Tcp MaxConn = -1) are left out.
func parseSNMP(b []byte) (map[string]map[string]uint64, error) {
	out := map[string]map[string]uint64{}
	names := map[string][]string{} // group -> header waiting for its values
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		group, ok := strings.CutSuffix(f[0], ":")
		if !ok || group == "" {
			return nil, fmt.Errorf("malformed line %q", sc.Text())
		}
		hdr, haveHdr := names[group]
		if !haveHdr {
			names[group] = f[1:]
			continue
		}
		delete(names, group)
		vals := f[1:]
		if len(vals) != len(hdr) {
			return nil, fmt.Errorf("%s: %d names but %d values", group, len(hdr), len(vals))
		}
		m := out[group]
		if m == nil {
			m = make(map[string]uint64, len(hdr))
			out[group] = m
		}
		for i, name := range hdr {
			v, err := strconv.ParseUint(vals[i], 10, 64)
			if err != nil {
				if n, ierr := strconv.ParseInt(vals[i], 10, 64); ierr == nil && n < 0 {
					continue
				}
				return nil, fmt.Errorf("%s %s: %w", group, name, err)
			}
			m[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for g := range names {
		return nil, fmt.Errorf("%s: names without values", g)
	}
	return out, nil
}
