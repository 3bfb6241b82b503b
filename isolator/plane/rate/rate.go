// Package rate parses and prints bandwidth limits: rates in bytes per
// second and byte counts (bursts), written the way people write them; and
// holds the bandwidth limit itself (Limit: rate, burst, ceil, and its
// bounds), shared by the lifecycle and the kernel's shaping. Table tests.
//
// A rate is a non-negative decimal number followed by an optional unit:
//
//	2000000        bytes per second (no unit)
//	10MB/s 10MBps  bytes: B (upper case), "byte", "bytes"; "/s" or "ps" optional
//	10MiB/s        binary prefixes Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024)
//	100Mbit 100mbps 100Mb/s
//	               bits: "bit", "bits", b (lower case), "bps"; divided by 8
//	1.5GB/s        fractions are fine; the result is rounded to whole bytes
//
// Prefixes k, M, G, T, P, E are decimal (1000) and case-insensitive; the letter b/B
// alone decides bits or bytes, as in "Mb/s" vs "MB/s". Note that tc(8)
// reads "mbps" as megaBYTES per second; here, as on most spec sheets,
// "mbps" is megabits per second (write "MBps" or "MB/s" for bytes).
//
// "0" and "none" mean no limit (Parse returns 0). A byte count (ParseSize,
// for bursts) has the same syntax without the per-second part: 64KiB, 1MB,
// 100000; bit units are refused there.
//
// Errors quote the value and say what is wrong (negative, not a number,
// unknown unit, too large, a non-zero rate below one byte per second).
package rate

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Max is the largest rate or size accepted: it must fit an int64 (the API's
// type) and the kernel's 64-bit rates.
const Max = math.MaxInt64

// Errors wrapped by Parse and ParseSize (test with errors.Is).
var (
	ErrSyntax   = errors.New("not a number with a unit")
	ErrNegative = errors.New("must not be negative")
	ErrUnit     = errors.New("unknown unit")
	ErrRange    = errors.New("too large")
	ErrTooSmall = errors.New("below one byte")
)

// Examples of accepted rates, for error messages.
const Examples = "10MB/s, 10MiB/s, 100Mbit, 100mbps, 1.5GB/s, or 2000000 (bytes per second)"

// Parse reads a rate and returns it in bytes per second (0 for "0" or
// "none": no limit).
func Parse(s string) (uint64, error) {
	return parse(s, true)
}

// ParseSize reads a byte count such as a burst: "64KiB", "1MB", "100000".
func ParseSize(s string) (uint64, error) {
	return parse(s, false)
}

func parse(s string, isRate bool) (uint64, error) {
	what, examples := "rate", Examples
	if !isRate {
		what, examples = "size", "64KiB, 1MB, or 100000 (bytes)"
	}
	in := strings.TrimSpace(s)
	fail := func(err error, detail string) (uint64, error) {
		if detail != "" {
			return 0, fmt.Errorf("%s %q: %w (%s)", what, s, err, detail)
		}
		return 0, fmt.Errorf("%s %q: %w", what, s, err)
	}
	if in == "" {
		return fail(ErrSyntax, "examples: "+examples)
	}
	if strings.EqualFold(in, "none") {
		return 0, nil
	}
	if in[0] == '-' {
		return fail(ErrNegative, "")
	}
	in = strings.TrimPrefix(in, "+")
	i := 0
	for i < len(in) && (in[i] >= '0' && in[i] <= '9' || in[i] == '.') {
		i++
	}
	num, unit := in[:i], strings.TrimSpace(in[i:])
	if num == "" || strings.Count(num, ".") > 1 || num == "." {
		return fail(ErrSyntax, "examples: "+examples)
	}
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return fail(ErrSyntax, "examples: "+examples)
	}
	mult, bits, err := unitOf(unit, isRate)
	if err != nil {
		return fail(ErrUnit, fmt.Sprintf("%q; examples: %s", unit, examples))
	}
	v.Mul(v, new(big.Rat).SetInt(mult))
	if bits {
		v.Quo(v, big.NewRat(8, 1))
	}
	// round half up to whole bytes
	n := new(big.Int).Quo(new(big.Int).Add(new(big.Int).Mul(v.Num(), big.NewInt(2)), v.Denom()), new(big.Int).Mul(v.Denom(), big.NewInt(2)))
	if !n.IsInt64() {
		return fail(ErrRange, fmt.Sprintf("at most %s", formatMax(isRate)))
	}
	if n.Sign() == 0 && v.Sign() != 0 {
		return fail(ErrTooSmall, "")
	}
	return n.Uint64(), nil
}

func formatMax(isRate bool) string {
	if isRate {
		return Format(Max)
	}
	return FormatSize(Max)
}

var prefixes = map[byte]int{'k': 1, 'm': 2, 'g': 3, 't': 4, 'p': 5, 'e': 6}

// unitOf returns the multiplier of unit (before the division by 8 for
// bits) and whether it counts bits.
func unitOf(unit string, isRate bool) (*big.Int, bool, error) {
	if unit == "" {
		return big.NewInt(1), false, nil
	}
	exp, base := 0, int64(1000)
	body := unit
	if p, ok := prefixes[lower(unit[0])]; ok && len(unit) > 1 {
		exp, body = p, unit[1:]
		if lower(body[0]) == 'i' && len(body) > 1 {
			base, body = 1024, body[1:]
		}
	}
	bits, ok := bodyOf(body, isRate)
	if !ok {
		return nil, false, ErrUnit
	}
	m := new(big.Int).Exp(big.NewInt(base), big.NewInt(int64(exp)), nil)
	return m, bits, nil
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// bodyOf classifies a unit without its prefix: bytes or bits. For a rate
// the per-second suffix ("/s", "ps") is optional; a size refuses bits and
// per-second forms.
func bodyOf(body string, isRate bool) (bits, ok bool) {
	word := strings.ToLower(body)
	perSecond := false
	for _, suf := range []string{"/s", "ps"} {
		if len(word) > len(suf) && strings.HasSuffix(word, suf) {
			word, body, perSecond = word[:len(word)-len(suf)], body[:len(body)-len(suf)], true
			break
		}
	}
	if perSecond && !isRate {
		return false, false
	}
	switch {
	case body == "B", word == "byte", word == "bytes":
		return false, true
	case (body == "b" || word == "bit" || word == "bits") && isRate:
		return true, true
	}
	return false, false
}

// Format prints a rate in bytes per second for people, in decimal units
// ("2MB/s", "1.5GB/s", "12.5MB/s"), or binary units when that is exact and
// decimal is not ("10MiB/s"); 0 prints as "none". Values that need more
// than three decimals are rounded ("~" marks them). Parse reads back every
// exact result.
func Format(bps uint64) string {
	if bps == 0 {
		return "none"
	}
	return human(bps, false, "/s")
}

// FormatBits prints a rate in bits per second: "16Mbit/s".
func FormatBits(bps uint64) string {
	if bps == 0 {
		return "none"
	}
	v := new(big.Rat).SetFrac(new(big.Int).Mul(new(big.Int).SetUint64(bps), big.NewInt(8)), big.NewInt(1))
	units := []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s", "Ebit/s", "Zbit/s"}
	return scaled(v, 1000, units)
}

// FormatSize prints a byte count, in binary units when exact ("64KiB"),
// else decimal ("1MB", "1500B").
func FormatSize(n uint64) string {
	return human(n, true, "")
}

func human(n uint64, preferBinary bool, suffix string) string {
	v := new(big.Rat).SetInt(new(big.Int).SetUint64(n))
	dec := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB"}
	bin := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	for i := range dec {
		dec[i] += suffix
		bin[i] += suffix
	}
	d, b := scaled(v, 1000, dec), scaled(v, 1024, bin)
	exact := func(s string) bool { return !strings.HasPrefix(s, "~") }
	switch {
	case preferBinary && exact(b), !exact(d) && exact(b):
		return b
	}
	return d // exact, or both rounded (decimal reads better)
}

// scaled prints v in the largest unit in which it is at least 1, exactly
// with up to three decimals; otherwise rounded to three decimals and marked
// with "~".
func scaled(v *big.Rat, base int64, units []string) string {
	b := big.NewRat(base, 1)
	u := 0
	x := new(big.Rat).Set(v)
	for u < len(units)-1 && x.Cmp(b) >= 0 {
		x.Quo(x, b)
		u++
	}
	thousand := new(big.Rat).Mul(x, big.NewRat(1000, 1))
	if thousand.IsInt() {
		f, _ := x.Float64()
		return strconv.FormatFloat(f, 'f', -1, 64) + units[u]
	}
	f, _ := x.Float64()
	s := strconv.FormatFloat(f, 'f', 3, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return "~" + s + units[u]
}
