package unarygrpc

import (
	"testing"
	"time"
)

func TestEncodeTimeout(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "1n"},
		{0, "1n"},
		{1500 * time.Nanosecond, "1500n"},
		{99999999 * time.Nanosecond, "99999999n"},
		{100000000 * time.Nanosecond, "100000u"},
		{time.Minute, "60000000u"},
		{2 * time.Minute, "120000m"},
		{30 * time.Hour, "108000S"},
		{time.Duration(1<<63 - 1), "2562048H"},
	} {
		if got := encodeTimeout(tc.d); got != tc.want {
			t.Errorf("encodeTimeout(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestDecodeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                  "plain",
		"100%25 sure":            "100% sure",
		"caf%C3%A9%0Aline":       "café\nline",
		"bad %zz and %4":         "bad %zz and %4",
		"trailing %":             "trailing %",
		"%22quoted%22 %E2%9C%97": "\"quoted\" ✗",
	} {
		if got := decodeMessage(in); got != want {
			t.Errorf("decodeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
