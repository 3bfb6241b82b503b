package main

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// parseGoBench reads `go test -bench` output and returns one MicroBenchmark
// per result line ("BenchmarkX-2  1000  123 ns/op  4 B/op ..."), with the
// package from the preceding "pkg:" line. Other lines are ignored.
func parseGoBench(r io.Reader) []MicroBenchmark {
	var out []MicroBenchmark
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		mb := MicroBenchmark{Package: pkg, Name: trimProcs(f[0]), Iterations: iters, Metrics: map[string]float64{}}
		ok := true
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			mb.Metrics[f[i+1]] = v
		}
		if ok {
			out = append(out, mb)
		}
	}
	return out
}

// trimProcs drops the "-<GOMAXPROCS>" suffix go test adds to a name.
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}
