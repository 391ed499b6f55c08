// Package benchenv reads the knobs the benchmark tests share
// (SHOAL_BENCH_SECONDS, SHOAL_BENCH_WORKERS), so every harness spells them
// the same way.
package benchenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Duration is SHOAL_BENCH_SECONDS (whole seconds) or def.
func Duration(def time.Duration) (time.Duration, error) {
	s := os.Getenv("SHOAL_BENCH_SECONDS")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("SHOAL_BENCH_SECONDS=%q: want a positive number of seconds", s)
	}
	return time.Duration(n) * time.Second, nil
}

// Workers is SHOAL_BENCH_WORKERS (comma-separated client counts, e.g.
// "16,64") or def.
func Workers(def ...int) ([]int, error) {
	s := os.Getenv("SHOAL_BENCH_WORKERS")
	if s == "" {
		return def, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("SHOAL_BENCH_WORKERS=%q: want comma-separated positive counts", s)
		}
		out = append(out, n)
	}
	return out, nil
}
