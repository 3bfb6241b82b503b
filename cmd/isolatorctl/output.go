package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/isolatord/isolatord/api"
	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
	"github.com/isolatord/isolatord/ephemeral"
	"github.com/isolatord/isolatord/isolator/plane/rate"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// timeString renders a timestamp in UTC, or "" when unset.
func timeString(ts *timestamppb.Timestamp, layout string) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(layout)
}

// limitString is "2MB/s (16Mbit/s)", with ", burst 64KiB" and ", ceil
// 4MB/s" when set, or "none".
func limitString(l *isolatordv1.BandwidthLimit) string {
	if l == nil || l.GetRate() <= 0 {
		return "none"
	}
	r := uint64(l.GetRate())
	s := fmt.Sprintf("%s (%s)", rate.Format(r), rate.FormatBits(r))
	if l.GetBurst() > 0 {
		s += ", burst " + rate.FormatSize(uint64(l.GetBurst()))
	}
	if l.GetCeil() > 0 {
		s += ", ceil " + rate.Format(uint64(l.GetCeil()))
	}
	return s
}

// Table helpers.

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// orDash stands in "-" for an empty value in a table.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func rangeString(begin, end uint32) string {
	if begin == end {
		return fmt.Sprint(begin)
	}
	return fmt.Sprintf("%d-%d", begin, end)
}

// ephemeralString is "32768-33791", or "-" when unset.
func ephemeralString(r *isolatordv1.EphemeralRange) string {
	if r == nil {
		return "-"
	}
	return rangeString(r.GetBegin(), r.GetEnd())
}

func plural(n uint64, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// ephemeralWithSize is "32768-33791 (1024 ports)".
func ephemeralWithSize(r *isolatordv1.EphemeralRange) string {
	if r == nil {
		return "-"
	}
	if r.GetEnd() < r.GetBegin() {
		return ephemeralString(r)
	}
	return fmt.Sprintf("%s (%s)", ephemeralString(r), plural(uint64(r.GetEnd()-r.GetBegin())+1, "port"))
}

// portsString joins the ranges whose shared flag is shared: "31000-31099,32000",
// or "-" when there is none.
func portsString(ports []*isolatordv1.PortRange, shared bool) string {
	var parts []string
	for _, p := range ports {
		if p.GetShared() == shared {
			parts = append(parts, rangeString(p.GetBegin(), p.GetEnd()))
		}
	}
	return orDash(strings.Join(parts, ","))
}

// setWithSize is a port set string from the daemon with its size,
// "31000-31099 (100 ports)", or "-" when empty.
func setWithSize(s string) string {
	if s == "" {
		return "-"
	}
	set, err := ephemeral.ParseSet(s)
	if err != nil {
		return s // print what the daemon said, even if we cannot count it
	}
	return fmt.Sprintf("%s (%s)", s, plural(uint64(set.Len()), "port"))
}

// micros renders a duration given in microseconds: "850us", "1.2ms".
func micros(us uint64) string {
	if us < 1000 {
		return fmt.Sprintf("%dus", us)
	}
	return fmt.Sprintf("%.1fms", float64(us)/1000)
}

// containerResult prints one container.
type containerResult struct{ c *isolatordv1.Container }

func (r containerResult) jsonValue() any { return jsonOf(r.c) }

func (r containerResult) writeTable(w io.Writer) error {
	c := r.c
	source := c.GetNetnsSource()
	if source == "" && c.GetPid() != 0 {
		source = fmt.Sprintf("pid:%d", c.GetPid())
	}
	tw := newTable(w)
	fmt.Fprintf(tw, "Container:\t%s\n", c.GetContainerId())
	fmt.Fprintf(tw, "State:\t%s\n", api.StateName(c.GetState()))
	fmt.Fprintf(tw, "Ephemeral ports:\t%s\n", ephemeralWithSize(c.GetEphemeralPorts()))
	fmt.Fprintf(tw, "Ports:\t%s\n", portsString(c.GetPorts(), false))
	fmt.Fprintf(tw, "Shared ports:\t%s\n", portsString(c.GetPorts(), true))
	fmt.Fprintf(tw, "Veth:\t%s\n", orDash(c.GetVeth()))
	netnsPath := orDash(c.GetNetns())
	if c.GetNetns() != "" && !c.GetPinOwned() {
		netnsPath += " (the runtime's pin: isolatord never unmounts it)"
	}
	fmt.Fprintf(tw, "Netns:\t%s\n", netnsPath)
	fmt.Fprintf(tw, "Netns source:\t%s\n", orDash(source))
	fmt.Fprintf(tw, "Created:\t%s\n", orDash(timeString(c.GetCreatedAt(), time.RFC3339)))
	fmt.Fprintf(tw, "Isolated:\t%s\n", orDash(timeString(c.GetIsolatedAt(), time.RFC3339)))
	fmt.Fprintf(tw, "Egress limit:\t%s\n", limitString(c.GetEgressLimit()))
	fmt.Fprintf(tw, "Ingress limit:\t%s\n", limitString(c.GetIngressLimit()))
	fmt.Fprintf(tw, "Labels:\t%s\n", labelsString(c.GetLabels()))
	writeDrain(tw, c)
	return tw.Flush()
}

// listResult prints containers, one per row.
type listResult []*isolatordv1.Container

func (l listResult) jsonValue() any {
	out := make([]any, 0, len(l))
	for _, c := range l {
		out = append(out, jsonOf(c))
	}
	return out
}

func (l listResult) writeTable(w io.Writer) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "CONTAINER\tSTATE\tEPHEMERAL\tPORTS\tSHARED\tVETH\tCREATED")
	for _, c := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			c.GetContainerId(), api.StateName(c.GetState()), ephemeralString(c.GetEphemeralPorts()),
			portsString(c.GetPorts(), false), portsString(c.GetPorts(), true)+drainingSuffix(c),
			orDash(c.GetVeth()), orDash(timeString(c.GetCreatedAt(), time.RFC3339)))
	}
	return tw.Flush()
}

// usageResult prints a container's usage; snmp lists the SNMP counters in
// the table.
type usageResult struct {
	u    *isolatordv1.UsageResponse
	snmp bool
}

func (r usageResult) jsonValue() any { return jsonOf(r.u) }

func (r usageResult) writeTable(w io.Writer) error {
	u := r.u
	tw := newTable(w)
	fmt.Fprintf(tw, "Container:\t%s\n", u.GetContainerId())
	fmt.Fprintf(tw, "Ephemeral ports:\t%s\n", ephemeralWithSize(u.GetEphemeralPorts()))
	if u.GetCollectedAt() != nil {
		fmt.Fprintf(tw, "Collected:\t%s\n", timeString(u.GetCollectedAt(), time.RFC3339))
	}
	t := u.GetTraffic()
	if t == nil {
		fmt.Fprintf(tw, "Traffic:\t-\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if t != nil {
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintln(tw, "TRAFFIC\tBYTES\tPACKETS\tERRORS\tDROPPED")
		fmt.Fprintf(tw, "rx\t%d\t%d\t%d\t%d\n", t.GetRxBytes(), t.GetRxPackets(), t.GetRxErrors(), t.GetRxDropped())
		fmt.Fprintf(tw, "tx\t%d\t%d\t%d\t%d\n", t.GetTxBytes(), t.GetTxPackets(), t.GetTxErrors(), t.GetTxDropped())
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintf(tw, "Refused by the host:\t%s\n", dropsString(u.GetDroppedPackets()))
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}

	if eg, in := u.GetEgressShaping(), u.GetIngressShaping(); eg != nil || in != nil {
		tw = newTable(w)
		fmt.Fprintln(tw, "SHAPING\tLIMIT\tBYTES\tPACKETS\tDROPS\tOVERLIMITS\tQUEUED\tQUEUE")
		for _, x := range []struct {
			dir string
			s   *isolatordv1.ShapingStats
		}{{"egress", eg}, {"ingress", in}} {
			if x.s == nil {
				fmt.Fprintf(tw, "%s\tnone\t-\t-\t-\t-\t-\t-\n", x.dir)
				continue
			}
			queue := x.s.GetQueue()
			if !x.s.GetEnforced() {
				queue = "NOT ENFORCED"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", x.dir, limitString(x.s.GetLimit()),
				x.s.GetBytes(), x.s.GetPackets(), x.s.GetDrops(), x.s.GetOverlimits(),
				fmt.Sprintf("%dB/%dp", x.s.GetBacklogBytes(), x.s.GetBacklogPackets()), orDash(queue))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	} else if t != nil {
		tw = newTable(w)
		fmt.Fprintf(tw, "Shaping:\tnone\n")
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	tw = newTable(w)
	if tcp := u.GetTcp(); tcp == nil {
		fmt.Fprintf(tw, "TCP:\t-\n")
	} else {
		fmt.Fprintf(tw, "TCP connections:\t%d active, %d in time-wait\n", tcp.GetActiveConnections(), tcp.GetTimeWaitConnections())
		if p := tcp.GetRtt(); p == nil {
			fmt.Fprintf(tw, "TCP RTT:\t-\n")
		} else {
			fmt.Fprintf(tw, "TCP RTT:\tp50 %s  p90 %s  p95 %s  p99 %s  (%s)\n",
				micros(p.GetP50Us()), micros(p.GetP90Us()), micros(p.GetP95Us()), micros(p.GetP99Us()),
				plural(p.GetSamples(), "connection"))
		}
	}
	snmp := u.GetSnmp()
	n := len(snmp.GetIp()) + len(snmp.GetIcmp()) + len(snmp.GetTcp()) + len(snmp.GetUdp())
	switch {
	case snmp == nil:
		fmt.Fprintf(tw, "SNMP:\t-\n")
	case !r.snmp:
		fmt.Fprintf(tw, "SNMP:\t%s (--snmp lists them)\n", plural(uint64(n), "counter"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if snmp != nil && r.snmp {
		fmt.Fprintln(w)
		tw = newTable(w)
		fmt.Fprintln(tw, "SNMP COUNTER\tVALUE")
		for _, g := range []struct {
			name string
			m    map[string]uint64
		}{{"Ip", snmp.GetIp()}, {"Icmp", snmp.GetIcmp()}, {"Tcp", snmp.GetTcp()}, {"Udp", snmp.GetUdp()}} {
			for _, k := range slices.Sorted(maps.Keys(g.m)) {
				fmt.Fprintf(tw, "%s.%s\t%d\n", g.name, k, g.m[k])
			}
		}
		return tw.Flush()
	}
	return nil
}

// statusResult prints the daemon's status.
type statusResult struct{ s *isolatordv1.StatusResponse }

func (r statusResult) jsonValue() any { return jsonOf(r.s) }

func (r statusResult) writeTable(w io.Writer) error {
	s := r.s
	host := orDash(s.GetHostIp())
	if s.GetHostInterface() != "" {
		host += " on " + s.GetHostInterface()
	}

	var byState []string
	for _, k := range slices.Sorted(maps.Keys(s.GetContainersByState())) {
		byState = append(byState, fmt.Sprintf("%s %d", k, s.GetContainersByState()[k]))
	}
	containers := fmt.Sprint(s.GetContainers())
	if len(byState) > 0 {
		containers += " (" + strings.Join(byState, ", ") + ")"
	}

	var have, missing []string
	for _, k := range slices.Sorted(maps.Keys(s.GetFeatures())) {
		if s.GetFeatures()[k] {
			have = append(have, k)
		} else {
			missing = append(missing, k)
		}
	}
	features := orDash(strings.Join(have, ", "))
	if len(missing) > 0 {
		features += " (missing: " + strings.Join(missing, ", ") + ")"
	}

	tw := newTable(w)
	fmt.Fprintf(tw, "Version:\t%s\n", orDash(s.GetVersion()))
	fmt.Fprintf(tw, "Host:\t%s\n", host)
	ipv6 := "- (containers have IPv4 only)"
	if len(s.GetHostIpv6()) > 0 {
		ipv6 = strings.Join(s.GetHostIpv6(), ", ")
	}
	fmt.Fprintf(tw, "Host IPv6:\t%s\n", ipv6)
	fmt.Fprintf(tw, "Ephemeral pool:\t%s\n", setWithSize(s.GetEphemeralPool()))
	fmt.Fprintf(tw, "Ephemeral blocks:\t%d of %s: %d used, %d free\n",
		s.GetEphemeralBlocksTotal(), plural(uint64(s.GetBlockSize()), "port"),
		s.GetEphemeralBlocksUsed(), s.GetEphemeralBlocksFree())
	fmt.Fprintf(tw, "Managed static ports:\t%s\n", setWithSize(s.GetManagedPorts()))
	loopback := "none (containers reach no host-only service on 127.0.0.0/8 or ::1)"
	if s.GetHostLoopbackPorts() != "" {
		loopback = s.GetHostLoopbackPorts()
	}
	fmt.Fprintf(tw, "Host loopback ports:\t%s\n", loopback)
	fmt.Fprintf(tw, "Held exclusively:\t%s\n", setWithSize(s.GetStaticPortsExclusive()))
	fmt.Fprintf(tw, "Held shared:\t%s\n", setWithSize(s.GetStaticPortsShared()))
	fmt.Fprintf(tw, "Containers:\t%s\n", containers)
	fmt.Fprintf(tw, "Features:\t%s\n", features)
	speed := "unknown (limits are not checked against it)"
	if s.GetLinkSpeedMbps() > 0 {
		speed = fmt.Sprintf("%d Mbit/s", s.GetLinkSpeedMbps())
	}
	fmt.Fprintf(tw, "Link speed:\t%s\n", speed)
	shaping := "HTB with a " + s.GetShapingQueue() + " queue"
	if s.GetShapingQueue() == "" {
		shaping = "unavailable (no HTB in the kernel: limits are refused)"
	}
	fmt.Fprintf(tw, "Bandwidth shaping:\t%s\n", shaping)
	fmt.Fprintf(tw, "Default limits:\tegress %s; ingress %s\n", limitString(s.GetDefaultEgressLimit()), limitString(s.GetDefaultIngressLimit()))
	writeHostPorts(tw, s.GetHostPorts())
	writeRecovery(tw, s)
	fmt.Fprintf(tw, "Orphans reclaimed:\t%d\n", s.GetOrphansReclaimed())
	writeFragments(tw, s.GetFragments())
	return tw.Flush()
}

// cleanupResult confirms a cleanup.
type cleanupResult struct{ id string }

// jsonValue names the container: CleanupResponse has no fields.
func (r cleanupResult) jsonValue() any { return map[string]string{"container_id": r.id} }

func (r cleanupResult) writeTable(w io.Writer) error {
	_, err := fmt.Fprintf(w, "Container %s cleaned up\n", r.id)
	return err
}

// dropsString sums the frames the host refused and names the reasons of
// those that are not zero: "3 (port 2, protocol 1)", or "0"; none at all
// (a host without cls_bpf) is said so.
func dropsString(m map[string]uint64) string {
	if len(m) == 0 {
		// the daemon reports every reason when it counts them
		return "not counted per container on this host (the kernel does not load cls_bpf programs)"
	}
	var total uint64
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(m)) {
		if m[r] > 0 {
			total += m[r]
			parts = append(parts, fmt.Sprintf("%s %d", r, m[r]))
		}
	}
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}
