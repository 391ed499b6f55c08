package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/d1client"
)

// insightsCmd is `shoal d1 insights DB`: wrangler d1 insights against the
// edge's insights endpoint (a Shoal extension; docs/api.md). Options are
// validated by the edge, so the CLI and the API refuse the same things;
// only --limit below 1 is refused here, since a zero limit would reach the
// client as "the default".
func (e *d1Env) insightsCmd() *cobra.Command {
	var o d1client.InsightsOptions
	cmd := &cobra.Command{
		Use:   "insights DB",
		Short: "Show the top query shapes by time, rows read or written, or count",
		Long: `Show a database's top query shapes over a recent period, like
wrangler d1 insights: per normalised statement (literals replaced by ?),
how often it ran, its total and average duration, rows read and rows
written, the slowest run and the errors. Read from the platform's query
analytics (ClickHouse) through the edge: an edge without analytics, or
with its store down, answers "unavailable" (exit 5), never zeros.`,
		Example: `  shoal d1 insights my-db
  shoal d1 insights my-db --time-period 7d --sort-by reads
  shoal d1 insights my-db --sort-by time --sort-type avg --limit 20
  shoal d1 insights my-db --json | jq '.[0].query'`,
	}
	cmd.Args = e.nargs(1, "one database name or UUID")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		if o.Limit < 1 {
			return usagef("--limit must be at least 1")
		}
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		var raw json.RawMessage
		shapes, err := c.Insights(ctx, id, o, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		order := o.SortType + " of " + o.SortBy
		if o.SortBy == "count" {
			order = "count"
		}
		if len(shapes) == 0 {
			fmt.Fprintf(e.stdout, "No queries on %s in the last %s.\n", args[0], o.TimePeriod)
			return nil
		}
		fmt.Fprintf(e.stdout, "Top %d query shapes of %s in the last %s, by %s:\n", len(shapes), args[0], o.TimePeriod, order)
		return e.table(insightsHeader, insightsRows(shapes))
	})
	f := cmd.Flags()
	f.StringVar(&o.TimePeriod, "time-period", "1d", "period up to now: minutes, hours or days (30m, 12h, 7d), at most 31d")
	f.StringVar(&o.TimePeriod, "timePeriod", "1d", "same as --time-period (wrangler's spelling)")
	_ = f.MarkHidden("timePeriod")
	f.StringVar(&o.SortBy, "sort-by", "time", "rank by time, reads, writes or count")
	f.StringVar(&o.SortType, "sort-type", "sum", "rank by the sum or the avg (per query) of --sort-by")
	f.IntVar(&o.Limit, "limit", 5, "number of query shapes to show (1 to 1000)")
	f.BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	return cmd
}

var insightsHeader = []string{"query", "count", "total_ms", "avg_ms", "max_ms",
	"rows_read", "avg_rows_read", "rows_written", "avg_rows_written", "errors"}

// insightsRows formats the figures: durations to the microsecond (what the
// hosts measure), averages of rows to two decimals, counts exactly.
func insightsRows(shapes []d1client.QueryInsight) [][]string {
	rows := make([][]string, 0, len(shapes))
	for _, s := range shapes {
		q := s.Query
		if q == "" {
			q = "(statement text not recorded)"
		}
		rows = append(rows, []string{q, fmt.Sprint(s.NumberOfTimesRun),
			fmt.Sprintf("%.3f", s.TotalDurationMs), fmt.Sprintf("%.3f", s.AvgDurationMs), fmt.Sprintf("%.3f", s.MaxDurationMs),
			fmt.Sprint(s.TotalRowsRead), fmt.Sprintf("%.2f", s.AvgRowsRead),
			fmt.Sprint(s.TotalRowsWritten), fmt.Sprintf("%.2f", s.AvgRowsWritten),
			fmt.Sprint(s.NumberOfErrors)})
	}
	return rows
}
