package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// goBench is one result line of `go test -bench`.
type goBench struct {
	name    string // without the -GOMAXPROCS suffix
	n       int
	metrics map[string]float64 // unit -> value ("ns/op", "ns/proc", ...)
}

// goBenchPackages are the product's packages with benchmarks.
var goBenchPackages = []string{"./procscan", "./supervisor/exitwatch"}

// runGoBench runs the product module's benchmarks and returns them by name,
// with the raw output.
func runGoBench(ctx context.Context, repo, benchtime string) (map[string]goBench, string, error) {
	args := append([]string{"test", "-run", "^$", "-bench", ".", "-benchtime", benchtime, "-count", "1"}, goBenchPackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, string(out), fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	res := parseGoBench(out)
	return res, string(out), nil
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+(\d+)\s+(.*)$`)

// parseGoBench reads the result lines of `go test -bench` output
// ("BenchmarkX/y-2   100   123 ns/op   4.5 ns/proc").
func parseGoBench(out []byte) map[string]goBench {
	res := map[string]goBench{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[3])
		if err != nil {
			continue
		}
		b := goBench{name: m[1], n: n, metrics: map[string]float64{}}
		f := strings.Fields(m[4])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			b.metrics[f[i+1]] = v
		}
		res[b.name] = b
	}
	return res
}

func rawBenchLines(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Benchmark") || strings.HasPrefix(l, "pkg:") || strings.HasPrefix(l, "cpu:") {
			keep = append(keep, strings.TrimRight(l, " \t"))
		}
	}
	return strings.Join(keep, "\n")
}
