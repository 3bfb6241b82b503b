package rate

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"2000000", 2000000},
		{"0", 0},
		{"none", 0},
		{"None", 0},
		{"10MB/s", 10_000_000},
		{"10MBps", 10_000_000},
		{"10MB", 10_000_000},
		{"10 MB/s", 10_000_000},
		{" 10mB/s ", 10_000_000},
		{"10MiB/s", 10 << 20},
		{"10mib/s", 10 << 20 / 8}, // lower-case b: mebibits
		{"64KiB/s", 64 << 10},
		{"100Mbit", 12_500_000},
		{"100mbit/s", 12_500_000},
		{"100mbps", 12_500_000},
		{"100Mbps", 12_500_000},
		{"100Mb/s", 12_500_000},
		{"1Gbit", 125_000_000},
		{"1.5GB/s", 1_500_000_000},
		{"1.5GiB/s", 1610612736},
		{"2TB/s", 2_000_000_000_000},
		{"2kB/s", 2000},
		{"2KB/s", 2000},
		{"12bit", 2}, // 1.5 bytes rounds up
		{"8bit/s", 1},
		{"100bps", 13}, // 12.5
		{"100B/s", 100},
		{"100Bps", 100},
		{"100 bytes/s", 100},
		{"3Mbytes", 3_000_000},
		{"+5MB/s", 5_000_000},
		{"0.5MB/s", 500_000},
		{".5MB/s", 500_000},
		{"5.MB/s", 5_000_000},
		{"9223372036854775807", math.MaxInt64},
	} {
		got, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("Parse(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error
	}{
		{"", ErrSyntax},
		{"   ", ErrSyntax},
		{"fast", ErrSyntax},
		{"MB/s", ErrSyntax},
		{"1.2.3MB/s", ErrSyntax},
		{".", ErrSyntax},
		{"-5MB/s", ErrNegative},
		{"-1", ErrNegative},
		{" -0", ErrNegative},
		{"5 furlongs", ErrUnit},
		{"5k", ErrUnit},
		{"5Ki", ErrUnit},
		{"5MX/s", ErrUnit},
		{"5 MB/h", ErrUnit},
		{"1e6", ErrUnit},
		{"9223372036854775808", ErrRange},
		{"10000000000EB/s", ErrRange},
		{"5ZB/s", ErrUnit},
		{"99999999999TB/s", ErrRange},
		{"1bit", ErrTooSmall},
		{"0.4", ErrTooSmall},
	} {
		got, err := Parse(c.in)
		if !errors.Is(err, c.want) {
			t.Errorf("Parse(%q) = %d, %v; want error %v", c.in, got, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), "\""+c.in+"\"") {
			t.Errorf("Parse(%q): error %q does not quote the value", c.in, err)
		}
	}
	_, err := Parse("fast")
	if !strings.Contains(err.Error(), "10MB/s") {
		t.Errorf("syntax error %q gives no examples", err)
	}
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"100000", 100000},
		{"64KiB", 64 << 10},
		{"1MB", 1_000_000},
		{"1.5MiB", 1572864},
		{"1500B", 1500},
		{"2 bytes", 2},
		{"0", 0},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"10Mbit", "64kib", "10MB/s", "1bps", "-5KB", "big"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		} else if !strings.HasPrefix(err.Error(), "size ") {
			t.Errorf("ParseSize(%q): %q does not say size", in, err)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		in         uint64
		want, bits string
	}{
		{0, "none", "none"},
		{1, "1B/s", "8bit/s"},
		{999, "999B/s", "7.992kbit/s"},
		{2_000_000, "2MB/s", "16Mbit/s"},
		{4_000_000, "4MB/s", "32Mbit/s"},
		{12_500_000, "12.5MB/s", "100Mbit/s"},
		{1_500_000_000, "1.5GB/s", "12Gbit/s"},
		{10 << 20, "10MiB/s", "~83.886Mbit/s"},
		{1234567, "~1.235MB/s", "~9.877Mbit/s"},
	} {
		if got := Format(c.in); got != c.want {
			t.Errorf("Format(%d) = %q, want %q", c.in, got, c.want)
		}
		if got := FormatBits(c.in); got != c.bits {
			t.Errorf("FormatBits(%d) = %q, want %q", c.in, got, c.bits)
		}
	}
	if got := FormatSize(64 << 10); got != "64KiB" {
		t.Errorf("FormatSize(64KiB) = %q", got)
	}
	if got := FormatSize(1_000_000); got != "1MB" {
		t.Errorf("FormatSize(1MB) = %q", got)
	}
}

// Every exact Format result parses back to the same value.
func TestFormatRoundTrip(t *testing.T) {
	vals := []uint64{1, 7, 1000, 1024, 1500, 2_000_000, 123_456_000, 10 << 20, 3 << 30, 125_000_000_000, math.MaxInt64 / 1000 * 1000}
	for _, v := range vals {
		for _, s := range []string{Format(v), FormatSize(v), FormatBits(v)} {
			if strings.HasPrefix(s, "~") {
				continue
			}
			p := Parse
			if s == FormatSize(v) {
				p = ParseSize
			}
			got, err := p(s)
			if err != nil || got != v {
				t.Errorf("%d -> %q -> %d, %v", v, s, got, err)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"10MB/s", "100Mbit", "1.5GiB/s", "-1", "0", "12bit", "x", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err != nil {
			if !strings.Contains(err.Error(), "rate ") {
				t.Fatalf("Parse(%q): error %q does not name the rate", s, err)
			}
			return
		}
		if v > Max {
			t.Fatalf("Parse(%q) = %d above Max", s, v)
		}
		if f := Format(v); !strings.HasPrefix(f, "~") {
			if back, err := Parse(f); err != nil || back != v {
				t.Fatalf("Parse(%q) = %d; Format = %q; back %d, %v", s, v, f, back, err)
			}
		}
	})
}
