package e2e

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isolatord/isolatord/test/wait"
)

// BenchmarkDockerRun (make bench runs it; scripts/bench.sh): `docker run -d`
// to the container's first answer, on an isolator network (a TCP echo from
// the client namespace on the host's IP) and with --network none (the
// program's "ready" in docker logs: no network to answer on), the median of
// a few runs each; their difference is about the driver's share. Then the
// same on the isolator network with DOCKER_BENCH_PRESENT (default 100)
// containers already running on it (at most 120). One pass whatever b.N: the figures are
// reported as metrics.
func BenchmarkDockerRun(b *testing.B) {
	runs := 5
	present := 100
	if v, err := strconv.Atoi(os.Getenv("DOCKER_BENCH_PRESENT")); err == nil && v >= 0 && v <= 120 {
		present = v
	}
	// Blocks of 64: the test daemon's pool (32768-40959) then holds 128
	// containers.
	e := newDockerEnv(b, "--ephemeral-ports-per-container", "64")
	k := e.k
	k.must("network", "create", "-d", e.driver, "--ipam-driver", "null", "isonet")

	timeRun := func(name string, network string, port int) time.Duration {
		args := []string{"run", "-d", "--name", name, "--network", network}
		if network != "none" {
			args = append(args, "-p", fmt.Sprintf("%d:%d", port, port))
		}
		args = append(args, e.serveArgs(name, port)...)
		start := time.Now()
		k.must(args...)
		ok := wait.Until(60*time.Second, func() bool {
			if network == "none" {
				out, _ := k.run(10*time.Second, "logs", name)
				return strings.Contains(out, "ready")
			}
			got, err := echoFromClient(e.sb, "tcp", port)
			return err == nil && got == name
		})
		d := time.Since(start)
		if !ok {
			b.Fatalf("%s did not answer within 60s", name)
		}
		k.must("rm", "-f", name)
		return d
	}
	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	measure := func(prefix, network string) time.Duration {
		var ds []time.Duration
		for i := 0; i < runs; i++ {
			ds = append(ds, timeRun(fmt.Sprintf("%s%d", prefix, i), network, 31001))
		}
		return median(ds)
	}
	b.ResetTimer()
	iso := measure("iso", "isonet")
	none := measure("none", "none")
	for i := 0; i < present; i++ {
		k.must("run", "-d", "--name", fmt.Sprintf("p%d", i), "--network", "isonet", "-p", fmt.Sprintf("%d:%d", 31100+i, 31100+i), e.image, "sleep", "3600")
	}
	loaded := measure("loaded", "isonet")
	b.StopTimer()
	rm := []string{"rm", "-f"}
	for i := 0; i < present; i++ {
		rm = append(rm, fmt.Sprintf("p%d", i))
	}
	if present > 0 {
		k.must(rm...)
	}
	b.ReportMetric(float64(iso.Milliseconds()), "ms/run-isolator")
	b.ReportMetric(float64(none.Milliseconds()), "ms/run-none")
	b.ReportMetric(float64((iso - none).Milliseconds()), "ms/driver-share")
	b.ReportMetric(float64(loaded.Milliseconds()), "ms/run-isolator-with-present")
	b.ReportMetric(float64(present), "present")
	b.Logf("docker run to first answer (median of %d): isolator %v, --network none %v (driver's share ~%v); with %d containers present: %v",
		runs, iso, none, iso-none, present, loaded)
}
