// Command reliability turns the robustness suite's run records (the JSON
// lines $SHOAL_ROBUSTNESS_RESULTS collects) into docs/reliability.md's
// tables:
//
//	SHOAL_ROBUSTNESS_RESULTS=/tmp/runs.jsonl make fault
//	go run ./test/robustness/cmd/reliability /tmp/runs.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/shoaldb/shoal/test/robustness/report"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: reliability RUNS.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	var recs []report.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r report.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "bad record:", err)
			os.Exit(1)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(report.Table(recs))
}
