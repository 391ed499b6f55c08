package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The two documents wrangler sends, as its source builds them
// (wrangler-dist/cli.js, `d1 info` and `d1 insights`; the same in 3.114
// and 4.86); LIMIT and ORDER are filled in per case.
const (
	wranglerInfoQuery = `query getD1MetricsOverviewQuery($accountTag: string, $filter: ZoneWorkersRequestsFilter_InputObject) {
								viewer {
									accounts(filter: {accountTag: $accountTag}) {
										d1AnalyticsAdaptiveGroups(limit: 10000, filter: $filter) {
											sum {
												readQueries
												writeQueries
												rowsRead
												rowsWritten
										}
										dimensions {
												datetimeHour
										}
									}
								}
							}
						}`
	wranglerInsightsQuery = `query getD1QueriesOverviewQuery($accountTag: string, $filter: ZoneWorkersRequestsFilter_InputObject) {
								viewer {
									accounts(filter: {accountTag: $accountTag}) {
										d1QueriesAdaptiveGroups(limit: LIMIT, filter: $filter, orderBy: [ORDER]) {
											sum {
												queryDurationMs
												rowsRead
												rowsWritten
												rowsReturned
											}
											avg {
												queryDurationMs
												rowsRead
												rowsWritten
												rowsReturned
											}
											count
											dimensions {
													query
											}
										}
									}
								}
							}`
)

// analyticsCall is one UsageAnalytics call.
type analyticsCall struct {
	method, account, database string
	from, to                  time.Time
	order                     ShapeOrder
	asc                       bool
	limit                     int
}

// fakeAnalytics holds usage per account and database, so a read for the
// wrong account finds nothing, like the real store.
type fakeAnalytics struct {
	fakeInsights
	mu     sync.Mutex
	hours  map[string][]HourUsage  // account/database → hours
	shapes map[string][]QueryShape // account/database → shapes in rank order
	calls  []analyticsCall
	err    error
}

func (f *fakeAnalytics) HourlyUsage(_ context.Context, acct, db string, from, to time.Time) ([]HourUsage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, analyticsCall{method: "hours", account: acct, database: db, from: from, to: to})
	if f.err != nil {
		return nil, f.err
	}
	return f.hours[acct+"/"+db], nil
}

func (f *fakeAnalytics) ShapesBetween(_ context.Context, acct, db string, from, to time.Time, order ShapeOrder, asc bool, limit int) ([]QueryShape, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, analyticsCall{"shapes", acct, db, from, to, order, asc, limit})
	if f.err != nil {
		return nil, f.err
	}
	s := f.shapes[acct+"/"+db]
	return s[:min(limit, len(s))], nil
}

func (f *fakeAnalytics) taken() []analyticsCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

const gqlPath = "/client/v4/graphql"

// gqlAnswer is a GraphQL answer.
type gqlAnswer struct {
	status int
	raw    []byte
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Path       []any          `json:"path"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

func (a gqlAnswer) code() string {
	if len(a.Errors) == 0 {
		return ""
	}
	c, _ := a.Errors[0].Extensions["code"].(string)
	return c
}

func gql(t *testing.T, e *env, token string, body any) gqlAnswer {
	t.Helper()
	b, ok := body.(string)
	if !ok {
		j, err := json.Marshal(body)
		require.NoError(t, err)
		b = string(j)
	}
	req, err := http.NewRequest("POST", e.ts.URL+gqlPath, strings.NewReader(b))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var a gqlAnswer
	require.NoError(t, json.Unmarshal(raw, &a), "%s", raw)
	a.status, a.raw = resp.StatusCode, raw
	return a
}

func newAnalyticsEnv(t *testing.T, mod ...func(*Options)) (*env, *fakeAnalytics) {
	src := &fakeAnalytics{hours: map[string][]HourUsage{}, shapes: map[string][]QueryShape{}}
	return newEnv(t, append([]func(*Options){func(o *Options) { o.Insights = src }}, mod...)...), src
}

func wranglerFilter(from, to time.Time, db string) map[string]any {
	return map[string]any{"AND": []any{map[string]any{
		"datetimeHour_geq": from.Format(time.RFC3339Nano), "datetimeHour_leq": to.Format(time.RFC3339Nano), "databaseId": db}}}
}

// `wrangler d1 info`: the hours in the range, grouped per datetimeHour,
// with the figures the store has; wrangler sums the groups.
func TestGraphQLWranglerInfo(t *testing.T) {
	e, src := newAnalyticsEnv(t)
	d := e.create(acctA, tokA, "info")
	now := e.clock.Now().UTC()
	h1, h2 := now.Truncate(time.Hour).Add(-2*time.Hour), now.Truncate(time.Hour)
	src.hours[acctA+"/"+d.UUID] = []HourUsage{
		{Hour: h1, ReadQueries: 3, WriteQueries: 1, RowsRead: 30, RowsWritten: 2, DurationUs: 1500},
		{Hour: h2, ReadQueries: 5, WriteQueries: 0, RowsRead: 50, DurationUs: 500},
	}
	from, to := now.Add(-24*time.Hour), now
	a := gql(t, e, tokA, map[string]any{"query": wranglerInfoQuery, "operationName": "getD1MetricsOverviewQuery",
		"variables": map[string]any{"accountTag": acctA, "filter": wranglerFilter(from, to, d.UUID)}})
	require.Equal(t, 200, a.status, "%s", a.raw)
	require.Empty(t, a.Errors, "%s", a.raw)
	assert.JSONEq(t, `{"viewer":{"accounts":[{"d1AnalyticsAdaptiveGroups":[
		{"sum":{"readQueries":3,"writeQueries":1,"rowsRead":30,"rowsWritten":2},"dimensions":{"datetimeHour":"`+h1.Format(time.RFC3339)+`"}},
		{"sum":{"readQueries":5,"writeQueries":0,"rowsRead":50,"rowsWritten":0},"dimensions":{"datetimeHour":"`+h2.Format(time.RFC3339)+`"}}]}]}}`,
		string(a.Data))
	assert.Contains(t, string(a.raw), `"errors":null`, "GraphQL's errors: null on success")
	calls := src.taken()
	require.Len(t, calls, 1)
	assert.Equal(t, analyticsCall{method: "hours", account: acctA, database: d.UUID, from: from, to: to}, calls[0])

	// Without datetimeHour, one group; with date, aliases and ordering.
	a = gql(t, e, tokA, map[string]any{"query": `query($db: string) { viewer { accounts(filter: {accountTag: "` + acctA + `"}) {
		total: d1AnalyticsAdaptiveGroups(limit: 5, filter: {databaseId: $db, date_geq: "` + from.Format("2006-01-02") + `"}) { count sum { queryBatchTimeMs } avg { queryBatchTimeMs sampleInterval } }
		hours: d1AnalyticsAdaptiveGroups(limit: 1, orderBy: [sum_rowsRead_DESC], filter: {databaseId: $db, datetime_gt: "` + from.Format(time.RFC3339) + `"}) { sum { rowsRead } dimensions { h: datetimeHour databaseId } }
	} } }`, "variables": map[string]any{"db": d.UUID}})
	require.Empty(t, a.Errors, "%s", a.raw)
	assert.JSONEq(t, `{"viewer":{"accounts":[{
		"total":[{"count":9,"sum":{"queryBatchTimeMs":2},"avg":{"queryBatchTimeMs":0.2222222222222222,"sampleInterval":1}}],
		"hours":[{"sum":{"rowsRead":50},"dimensions":{"h":"`+h2.Format(time.RFC3339)+`","databaseId":"`+d.UUID+`"}}]}]}}`, string(a.Data))
	calls = src.taken()
	require.Len(t, calls, 2)
	day, _ := time.Parse("2006-01-02", from.Format("2006-01-02"))
	assert.Equal(t, day, calls[0].from, "date_geq starts at the day's midnight")
	assert.Equal(t, from.Truncate(time.Second).Add(time.Millisecond), calls[1].from, "_gt excludes the instant")
	assert.Equal(t, now, calls[1].to, "the upper bound defaults to now")

	// Equality with an hour is that hour.
	a = gql(t, e, tokA, map[string]any{"query": `{ viewer { accounts(filter: {accountTag: "` + acctA + `"}) {
		d1AnalyticsAdaptiveGroups(limit: 5, filter: {databaseId: "` + d.UUID + `", datetimeHour: "` + h1.Add(7*time.Minute).Format(time.RFC3339) + `"}) { count } } } }`})
	require.Empty(t, a.Errors, "%s", a.raw)
	calls = src.taken()
	require.Len(t, calls, 1)
	assert.Equal(t, [2]time.Time{h1, h1.Add(time.Hour - time.Millisecond)}, [2]time.Time{calls[0].from, calls[0].to})
}

// `wrangler d1 insights`: every --sort-by / --sort-type / --sort-direction
// reaches the store as its order and direction; rowsReturned, which Shoal
// does not record, is null, not 0.
func TestGraphQLWranglerInsights(t *testing.T) {
	e, src := newAnalyticsEnv(t)
	d := e.create(acctA, tokA, "ins")
	src.shapes[acctA+"/"+d.UUID] = []QueryShape{
		{Hash: 1, Text: "SELECT * FROM t WHERE id = ?", Queries: 4, RowsRead: 10, RowsWritten: 0, DurationUs: 2500, MaxDurationUs: 900},
		{Hash: 2, Text: "INSERT INTO t VALUES (?)", Queries: 2, RowsWritten: 4, DurationUs: 300},
	}
	now := e.clock.Now()
	for order, want := range map[string]struct {
		o   ShapeOrder
		asc bool
	}{
		"sum_queryDurationMs_DESC": {ShapeByDuration, false}, "avg_queryDurationMs_ASC": {ShapeByAvgDuration, true},
		"sum_rowsRead_DESC": {ShapeByRowsRead, false}, "avg_rowsRead_DESC": {ShapeByAvgRowsRead, false},
		"sum_rowsWritten_ASC": {ShapeByRowsWritten, true}, "avg_rowsWritten_DESC": {ShapeByAvgRowsWritten, false},
		"count_DESC": {ShapeByCount, false}, "count_ASC": {ShapeByCount, true},
	} {
		q := strings.NewReplacer("LIMIT", "5", "ORDER", order).Replace(wranglerInsightsQuery)
		a := gql(t, e, tokA, map[string]any{"query": q, "operationName": "getD1QueriesOverviewQuery",
			"variables": map[string]any{"accountTag": acctA, "filter": wranglerFilter(now.Add(-time.Hour), now, d.UUID)}})
		require.Empty(t, a.Errors, "%s: %s", order, a.raw)
		calls := src.taken()
		require.Len(t, calls, 1, order)
		assert.Equal(t, analyticsCall{"shapes", acctA, d.UUID, now.Add(-time.Hour), now, want.o, want.asc, 5}, calls[0], order)
		if order == "sum_queryDurationMs_DESC" {
			assert.JSONEq(t, `{"viewer":{"accounts":[{"d1QueriesAdaptiveGroups":[
				{"sum":{"queryDurationMs":2.5,"rowsRead":10,"rowsWritten":0,"rowsReturned":null},
				 "avg":{"queryDurationMs":0.625,"rowsRead":2.5,"rowsWritten":0,"rowsReturned":null},
				 "count":4,"dimensions":{"query":"SELECT * FROM t WHERE id = ?"}},
				{"sum":{"queryDurationMs":0.3,"rowsRead":0,"rowsWritten":4,"rowsReturned":null},
				 "avg":{"queryDurationMs":0.15,"rowsRead":0,"rowsWritten":2,"rowsReturned":null},
				 "count":2,"dimensions":{"query":"INSERT INTO t VALUES (?)"}}]}]}}`, string(a.Data))
		}
	}
	q := strings.NewReplacer("LIMIT", "1", "ORDER", "count_DESC").Replace(wranglerInsightsQuery)
	a := gql(t, e, tokA, map[string]any{"query": q,
		"variables": map[string]any{"accountTag": acctA, "filter": wranglerFilter(now.Add(-time.Hour), now, d.UUID)}})
	require.Empty(t, a.Errors, "%s", a.raw)
	assert.Equal(t, 1, strings.Count(string(a.Data), `"query"`), "limit 1: %s", a.Data)
}

// One account never sees another's figures: naming another account is
// refused before any read, and another account's database UUID is read
// under the token's own account (where it has no usage).
func TestGraphQLScopedToTheTokensAccount(t *testing.T) {
	e, src := newAnalyticsEnv(t)
	b := e.create(acctB, tokB, "secret")
	src.hours[acctB+"/"+b.UUID] = []HourUsage{{Hour: e.clock.Now().Truncate(time.Hour), ReadQueries: 99, RowsRead: 1234}}
	now := e.clock.Now()
	vars := map[string]any{"accountTag": acctB, "filter": wranglerFilter(now.Add(-time.Hour), now, b.UUID)}
	a := gql(t, e, tokA, map[string]any{"query": wranglerInfoQuery, "variables": vars})
	assert.Equal(t, "FORBIDDEN", a.code(), "%s", a.raw)
	assert.Equal(t, "null", string(a.Data))
	assert.NotContains(t, string(a.raw), "1234")
	assert.Empty(t, src.taken(), "nothing was read")

	vars["accountTag"] = acctA
	a = gql(t, e, tokA, map[string]any{"query": wranglerInfoQuery, "variables": vars})
	require.Empty(t, a.Errors, "%s", a.raw)
	assert.JSONEq(t, `{"viewer":{"accounts":[{"d1AnalyticsAdaptiveGroups":[]}]}}`, string(a.Data))
	calls := src.taken()
	require.Len(t, calls, 1)
	assert.Equal(t, acctA, calls[0].account, "read under the token's account")

	// The owner sees them; so does the admin token naming the account.
	vars["accountTag"] = acctB
	for _, tok := range []string{tokB, adminTok} {
		a = gql(t, e, tok, map[string]any{"query": wranglerInfoQuery, "variables": vars})
		require.Empty(t, a.Errors, "%s", a.raw)
		assert.Contains(t, string(a.Data), `"rowsRead":1234`)
	}
}

// Anything outside the supported subset is a GraphQL error that names it,
// with data null, and the store is never read.
func TestGraphQLRefusesWhatItDoesNotSupport(t *testing.T) {
	e, src := newAnalyticsEnv(t)
	d := e.create(acctA, tokA, "strict")
	now := e.clock.Now()
	acc := `viewer { accounts(filter: {accountTag: "` + acctA + `"}) { `
	f := `filter: {databaseId: "` + d.UUID + `", datetimeHour_geq: "` + now.Add(-time.Hour).Format(time.RFC3339) + `"}`
	for _, c := range []struct{ doc, code, msg string }{
		{`{ ` + acc + `workersInvocationsAdaptive(limit: 1, ` + f + `) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", `dataset "workersInvocationsAdaptive" is not supported`},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, ` + f + `) { sum { queryBatchResponseBytes } } } } }`, "GRAPHQL_VALIDATION_FAILED", `field "queryBatchResponseBytes" of d1AnalyticsAdaptiveGroups.sum is not supported`},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, ` + f + `) { quantiles { queryBatchTimeMsP50 } } } } }`, "GRAPHQL_VALIDATION_FAILED", `field "quantiles" of d1AnalyticsAdaptiveGroups is not supported`},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, filter: {datetimeHour_geq: "2026-01-01T00:00:00Z"}) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "the filter needs databaseId"},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, filter: {databaseId: "` + d.UUID + `"}) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "lower time bound"},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, filter: {databaseId: "` + d.UUID + `", date_geq: "2020-01-01"}) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "over 31 days"},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 1, filter: {databaseId: "` + d.UUID + `", OR: []}) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", `filter field "OR" is not supported`},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(limit: 0, ` + f + `) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "limit must be an integer from 1 to 10000"},
		{`{ ` + acc + `d1AnalyticsAdaptiveGroups(` + f + `) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "needs a limit"},
		{`{ ` + acc + `d1QueriesAdaptiveGroups(limit: 1, ` + f + `, orderBy: [sum_rowsReturned_DESC]) { count dimensions { query } } } } }`, "GRAPHQL_VALIDATION_FAILED", "orderBy sum_rowsReturned is not supported"},
		{`{ ` + acc + `d1QueriesAdaptiveGroups(limit: 1, ` + f + `, orderBy: [count_DESC, sum_rowsRead_DESC]) { count dimensions { query } } } } }`, "GRAPHQL_VALIDATION_FAILED", "one orderBy is supported"},
		{`{ ` + acc + `d1QueriesAdaptiveGroups(limit: 1, ` + f + `) { count } } } }`, "GRAPHQL_VALIDATION_FAILED", "select dimensions { query }"},
		{`{ ` + acc + `d1QueriesAdaptiveGroups(limit: 1, ` + f + `, orderBy: [count]) { count dimensions { query } } } } }`, "GRAPHQL_VALIDATION_FAILED", "orderBy count is not supported"},
		{`{ viewer { zones { name } } }`, "GRAPHQL_VALIDATION_FAILED", `field "zones" is not supported on viewer`},
		{`{ viewer { accounts { x } } }`, "GRAPHQL_VALIDATION_FAILED", "accountTag"},
		{`mutation { deleteEverything }`, "GRAPHQL_PARSE_FAILED", "mutations are not supported"},
		{`{ viewer { ...F } } fragment F on viewer { accounts }`, "GRAPHQL_PARSE_FAILED", "fragments are not supported"},
		{`{ viewer @include(if: true) { accounts } }`, "GRAPHQL_PARSE_FAILED", "directives are not supported"},
		{`{ viewer { accounts(filter: {accountTag: "x"}) `, "GRAPHQL_PARSE_FAILED", "Syntax Error"},
		{`{ viewer { accounts(filter: {accountTag: "\q"}) { x } } }`, "GRAPHQL_PARSE_FAILED", `Invalid character escape sequence: \q`},
		{`{ viewer { accounts(filter: {accountTag: 01}) { x } } }`, "GRAPHQL_PARSE_FAILED", "Invalid number"},
		{`query A { viewer { accounts } } query B { viewer { accounts } }`, "GRAPHQL_VALIDATION_FAILED", "operationName is required"},
	} {
		a := gql(t, e, tokA, map[string]any{"query": c.doc})
		require.Equal(t, 200, a.status, "%s", c.doc)
		require.Len(t, a.Errors, 1, "%s: %s", c.doc, a.raw)
		assert.Equal(t, c.code, a.code(), "%s: %s", c.doc, a.raw)
		assert.Contains(t, a.Errors[0].Message, c.msg, c.doc)
		assert.Equal(t, "null", string(a.Data), c.doc)
	}
	assert.Empty(t, src.taken(), "the store was never read")

	// Selections nested past the bound are refused (bounded stack).
	deep := strings.Repeat("{ a ", 40) + strings.Repeat("}", 40)
	a := gql(t, e, tokA, map[string]any{"query": deep})
	assert.Equal(t, "GRAPHQL_PARSE_FAILED", a.code(), "%s", a.raw)

	// Not a GraphQL request at all; no token; a token of nobody.
	a = gql(t, e, tokA, `{"query": 1}`)
	assert.Equal(t, 400, a.status)
	assert.Equal(t, "BAD_REQUEST", a.code())
	a = gql(t, e, "", map[string]any{"query": wranglerInfoQuery})
	assert.Equal(t, 401, a.status)
	assert.Equal(t, "UNAUTHENTICATED", a.code())
	a = gql(t, e, "nobody", map[string]any{"query": wranglerInfoQuery})
	assert.Equal(t, 401, a.status)
}

// No analytics store, or a store that fails: an error saying so (and one
// log line), never empty figures.
func TestGraphQLUnavailable(t *testing.T) {
	var now time.Time
	body := func(db string) map[string]any {
		return map[string]any{"query": wranglerInfoQuery,
			"variables": map[string]any{"accountTag": acctA, "filter": wranglerFilter(now.Add(-time.Hour), now, db)}}
	}
	e := newEnv(t)
	now = e.clock.Now()
	d := e.create(acctA, tokA, "none")
	a := gql(t, e, tokA, body(d.UUID))
	assert.Equal(t, "UNAVAILABLE", a.code(), "%s", a.raw)
	assert.Contains(t, a.Errors[0].Message, insightsNoSourceText)
	assert.Equal(t, "null", string(a.Data))

	// A source without the GraphQL capability is not "no data" either.
	e2, _ := newInsightsEnv(t)
	d2 := e2.create(acctA, tokA, "old")
	now = e2.clock.Now()
	a = gql(t, e2, tokA, body(d2.UUID))
	assert.Equal(t, "UNAVAILABLE", a.code(), "%s", a.raw)

	logs := &lockedBuffer{}
	e3, src := newAnalyticsEnv(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	d3 := e3.create(acctA, tokA, "down")
	now = e3.clock.Now()
	src.err = errors.New("clickhouse: connection refused")
	a = gql(t, e3, tokA, body(d3.UUID))
	assert.Equal(t, "UNAVAILABLE", a.code(), "%s", a.raw)
	assert.Equal(t, insightsUnavailableText, a.Errors[0].Message)
	assert.NotContains(t, string(a.raw), "connection refused", "internals stay in the log")
	assert.Equal(t, 1, strings.Count(logs.String(), "graphql analytics read failed"), "%s", logs)
}

// The documents TestParseGraphQL parses, also FuzzParseGraphQL's seeds.
const gqlParseDoc = `# a comment
query Q($a: [String!]! = ["x", "y"], $n: Int = -12) {
	al: f(s: "t\u00e9\n\"q\"", b: """blo"ck""", e: ENUM_V, o: {k: [1, 2.5e3, null, true]}, v: $a) { g }
}`

var gqlParseBad = []string{``, `{}`, `{ a(x: ) }`, `{ a(x: "unterminated) }`, `{ a(x: 1.) }`, `{ a(x: $) }`, "{ a(x: \"\\uD800\") }",
	`{ a(x: [0x1]) }`, `{ a(x: 1_000) }`, `subscription S { a }`, `{ ... on T { a } }`, `query Q($v: T @d) { a }`,
	`query($v: ` + strings.Repeat("[", 20) + `T` + strings.Repeat("]", 20) + `) { a }`,
	`{ a(x: ` + strings.Repeat("[", 20) + strings.Repeat("]", 20) + `) }`}

// The parser keeps what the spec says: comments, commas, block strings,
// variable defaults, aliases, escapes.
func TestParseGraphQL(t *testing.T) {
	ops, err := parseGraphQL(gqlParseDoc)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	op := ops[0]
	assert.Equal(t, "Q", op.name)
	require.Len(t, op.vars, 2)
	require.NotNil(t, op.vars[1].def)
	assert.Equal(t, gqlValue{kind: gqlInt, text: "-12"}, *op.vars[1].def)
	sel := op.sels[0]
	assert.Equal(t, "al", sel.key())
	assert.Equal(t, "f", sel.name)
	require.Len(t, sel.args, 5)
	assert.Equal(t, "té\n\"q\"", sel.args[0].value.text)
	assert.Equal(t, `blo"ck`, sel.args[1].value.text)
	assert.Equal(t, gqlEnumKind, sel.args[2].value.kind)
	assert.Equal(t, gqlObject, sel.args[3].value.kind)
	assert.Len(t, sel.args[3].value.fields[0].value.list, 4)
	assert.Equal(t, gqlVariable, sel.args[4].value.kind)

	for _, bad := range gqlParseBad {
		_, err := parseGraphQL(bad)
		assert.Error(t, err, "%q", bad)
	}
	_, err = parseGraphQL("{ a }" + strings.Repeat(" ", gqlMaxQueryBytes))
	assert.ErrorContains(t, err, "over 32768 bytes")
}

// FuzzParseGraphQL: no document makes the parser panic, a refusal is a
// syntax error for the client, and whatever it accepts stays within the
// depth bounds.
func FuzzParseGraphQL(f *testing.F) {
	seeds := append([]string{gqlParseDoc, wranglerInfoQuery,
		strings.NewReplacer("LIMIT", "5", "ORDER", "sum_queryDurationMs_DESC").Replace(wranglerInsightsQuery),
		`{ viewer { accounts(filter: {accountTag: "x"}) { d1AnalyticsAdaptiveGroups(limit: 1, filter: {databaseId: "d", datetimeHour_geq: "2026-01-01T00:00:00Z"}) { sum { rowsRead } } } } }`,
		`query A { viewer { accounts } } query B { viewer { accounts } }`,
		`mutation { deleteEverything }`,
		`{ viewer { ...F } } fragment F on viewer { accounts }`,
		`{ viewer @include(if: true) { accounts } }`,
		`{ viewer { accounts(filter: {accountTag: "x"}) `,
		`{ viewer { accounts(filter: {accountTag: "\q"}) { x } } }`,
		`{ viewer { accounts(filter: {accountTag: 01}) { x } } }`,
		"{ a(x: \"\\uD83D\\uDE00\", y: \"\"\"\n  b\n\"\"\"\") }",
		strings.Repeat("{ a ", 40) + strings.Repeat("}", 40),
	}, gqlParseBad...)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		ops, err := parseGraphQL(doc)
		if err != nil {
			var se *gqlSyntaxError
			if !errors.As(err, &se) || !strings.HasPrefix(se.msg, "Syntax Error: ") {
				t.Fatalf("%q: error %T %v is not a syntax error", doc, err, err)
			}
			if ops != nil {
				t.Fatalf("%q: operations with an error", doc)
			}
			return
		}
		if len(doc) > gqlMaxQueryBytes {
			t.Fatalf("a document of %d bytes was accepted", len(doc))
		}
		if len(ops) == 0 {
			t.Fatalf("%q: accepted without an operation", doc)
		}
		var checkValue func(v gqlValue, depth int)
		checkValue = func(v gqlValue, depth int) {
			if depth > gqlMaxDepth {
				t.Fatalf("%q: value nested %d deep", doc, depth)
			}
			if v.kind < gqlVariable || v.kind > gqlObject {
				t.Fatalf("%q: value of kind %d", doc, v.kind)
			}
			for _, e := range v.list {
				checkValue(e, depth+1)
			}
			for _, e := range v.fields {
				checkValue(e.value, depth+1)
			}
		}
		var checkSels func(sels []gqlSelection, depth int)
		checkSels = func(sels []gqlSelection, depth int) {
			if depth > gqlMaxDepth {
				t.Fatalf("%q: selections nested %d deep", doc, depth)
			}
			if len(sels) == 0 {
				t.Fatalf("%q: an empty selection set", doc)
			}
			for _, s := range sels {
				if s.name == "" {
					t.Fatalf("%q: a selection without a name", doc)
				}
				for _, a := range s.args {
					checkValue(a.value, 0)
				}
				if s.hasSels {
					checkSels(s.sels, depth+1)
				} else if len(s.sels) > 0 {
					t.Fatalf("%q: subselections without hasSels", doc)
				}
			}
		}
		for _, op := range ops {
			if op.kind != "query" {
				t.Fatalf("%q: operation kind %q", doc, op.kind)
			}
			for _, v := range op.vars {
				if v.def != nil {
					checkValue(*v.def, 0)
				}
			}
			checkSels(op.sels, 1)
		}
	})
}

// The body limit holds.
func TestGraphQLBodyLimit(t *testing.T) {
	e, _ := newAnalyticsEnv(t)
	big := `{"query": "` + strings.Repeat(" ", gqlMaxBody) + `"}`
	req, err := http.NewRequest("POST", e.ts.URL+gqlPath, bytes.NewReader([]byte(big)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tokA)
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 413, resp.StatusCode)
}
