package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
)

// POST /client/v4/graphql: the two D1 datasets of Cloudflare's GraphQL
// Analytics API that D1's clients read, answered from the usage the object
// hosts report (Options.Insights, when it implements UsageAnalytics):
//
//   - d1AnalyticsAdaptiveGroups (`wrangler d1 info`'s 24 h figures): per
//     group of the requested dimensions (datetimeHour, date, databaseId),
//     count and sum {readQueries writeQueries rowsRead rowsWritten
//     queryBatchTimeMs}, avg {queryBatchTimeMs sampleInterval};
//   - d1QueriesAdaptiveGroups (`wrangler d1 insights`): per query shape
//     (dimensions {query databaseId}), count, sum and avg {queryDurationMs
//     rowsRead rowsWritten rowsReturned}, max {queryDurationMs}, ordered by
//     one of count, sum_/avg_ of queryDurationMs, rowsRead or rowsWritten,
//     _ASC or _DESC.
//
// The document goes through a strict parser (graphql_parse.go) and is
// checked against these fields before the store is read; any other field,
// argument, filter or ordering is a GraphQL error naming it and what is
// supported — never an empty or zero answer standing in for "not
// supported". rowsReturned is not recorded by Shoal and answers null.
// Filters: databaseId (required: usage is stored per database) and a time
// range on the windows' start — datetimeHour, datetime, datetimeMinute and
// date, each as equality (an hour, minute or day means all of it) or with
// _geq, _gt, _leq, _lt — combined with AND; the
// lower bound is required, the upper one defaults to now, the range is at
// most 31 days. Scope: viewer.accounts(filter: {accountTag}) must name the
// token's own account (the admin token may name any); the store is read
// for that account only, so another account's database UUID matches
// nothing.
//
// Answers follow GraphQL over HTTP: 200 with {data, errors}; errors alone
// (data null) when the request fails; 401 for a missing or unknown token,
// 429 with Retry-After when rate-limited.

const (
	gqlMaxBody  = 64 << 10
	gqlMaxLimit = 10_000 // Cloudflare's maximum limit for adaptive groups
	gqlTimeout  = 10 * time.Second
	gqlMaxRange = insightsMaxPeriod
)

func (s *Server) graphqlRoutes(r *mux.Router) {
	r.Handle("/client/v4/graphql", s.instrument("graphql", http.HandlerFunc(s.handleGraphQL))).Methods(http.MethodPost)
}

// gqlError is one entry of a GraphQL answer's errors.
type gqlError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path,omitempty"`
	Extensions map[string]any `json:"extensions,omitempty"`
}

// Error codes in extensions.code.
const (
	gqlCodeParse       = "GRAPHQL_PARSE_FAILED"
	gqlCodeValidation  = "GRAPHQL_VALIDATION_FAILED"
	gqlCodeBadRequest  = "BAD_REQUEST"
	gqlCodeAuth        = "UNAUTHENTICATED"
	gqlCodeForbidden   = "FORBIDDEN"
	gqlCodeRateLimited = "RATE_LIMITED"
	gqlCodeUnavailable = "UNAVAILABLE"
)

// gqlFailure aborts the execution of a request with one error.
type gqlFailure struct{ err gqlError }

func gqlErr(code string, path []any, format string, args ...any) *gqlFailure {
	p := append([]any(nil), path...)
	return &gqlFailure{gqlError{Message: fmt.Sprintf(format, args...), Path: p, Extensions: map[string]any{"code": code}}}
}

type gqlResponse struct {
	Data   any        `json:"data"`
	Errors []gqlError `json:"errors"`
}

func writeGQLError(w http.ResponseWriter, status int, e gqlError) {
	writeJSON(w, status, gqlResponse{Errors: []gqlError{e}})
}

// gqlRequest is GraphQL over HTTP's POST body (unknown members, such as
// extensions, are ignored).
type gqlRequest struct {
	Query         string         `json:"query"`
	OperationName string         `json:"operationName"`
	Variables     map[string]any `json:"variables"`
}

func (s *Server) handleGraphQL(w http.ResponseWriter, r *http.Request) {
	p, err := s.auth.authenticate(r.Context(), r.Header.Get("Authorization"))
	if err == nil && !p.admin {
		err = s.checkRate(p.accountID, "")
	}
	var rl *rateLimited
	switch {
	case errors.Is(err, errUnauthenticated), errors.Is(err, errTokenExpired):
		writeGQLError(w, http.StatusUnauthorized, gqlErr(gqlCodeAuth, nil, "Authentication error").err)
		return
	case err == nil && len(p.databases) > 0:
		// Account-wide analytics would show databases the token may not
		// see (scope.go).
		writeGQLError(w, http.StatusForbidden, gqlErr(gqlCodeAuth, nil, "This API token is limited to named databases: account-wide analytics are not available to it").err)
		return
	case errors.As(err, &rl):
		secs := int(math.Ceil(rl.after.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
		writeGQLError(w, http.StatusTooManyRequests, gqlErr(gqlCodeRateLimited, nil, "Too many requests for this account; please retry later").err)
		return
	case err != nil:
		s.writeErr(w, r, err) // the catalog could not check the token: 503, retry
		return
	}
	body, err := readBody(r.Body, gqlMaxBody)
	if err != nil {
		writeGQLError(w, http.StatusRequestEntityTooLarge, gqlErr(gqlCodeBadRequest, nil, "request body over %d bytes", gqlMaxBody).err)
		return
	}
	var req gqlRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil || dec.More() {
		writeGQLError(w, http.StatusBadRequest, gqlErr(gqlCodeBadRequest, nil, "the body must be a JSON object {query, operationName?, variables?}").err)
		return
	}
	if len(req.Query) > gqlMaxQueryBytes {
		writeGQLError(w, http.StatusBadRequest, gqlErr(gqlCodeBadRequest, nil, "query over %d bytes", gqlMaxQueryBytes).err)
		return
	}
	data, gerr := s.runGraphQL(r.Context(), p, req)
	if gerr != nil {
		writeGQLError(w, http.StatusOK, *gerr)
		return
	}
	writeJSON(w, http.StatusOK, gqlResponse{Data: data})
}

// runGraphQL parses, validates and executes one request.
func (s *Server) runGraphQL(ctx context.Context, p principal, req gqlRequest) (data any, gerr *gqlError) {
	ops, err := parseGraphQL(req.Query)
	if err != nil {
		e := gqlErr(gqlCodeParse, nil, "%s", err.Error()).err
		return nil, &e
	}
	var op *gqlOperation
	for i := range ops {
		if req.OperationName == "" && len(ops) == 1 || ops[i].name == req.OperationName {
			op = &ops[i]
			break
		}
	}
	if op == nil {
		msg := "operationName is required when the document has several operations"
		if req.OperationName != "" {
			msg = fmt.Sprintf("no operation named %q in the document", req.OperationName)
		}
		e := gqlErr(gqlCodeValidation, nil, "%s", msg).err
		return nil, &e
	}
	vars := map[string]any{}
	for _, v := range op.vars {
		if val, ok := req.Variables[v.name]; ok {
			vars[v.name] = val
		} else if v.def != nil {
			vars[v.name] = gqlLiteral{*v.def}
		}
	}
	x := &gqlExec{s: s, ctx: ctx, p: p, vars: vars, now: s.o.Now()}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(*gqlFailure)
			if !ok {
				panic(r)
			}
			data, gerr = nil, &f.err
		}
	}()
	return x.query(op.sels), nil
}

// gqlLiteral is a variable's default value, still a document value.
type gqlLiteral struct{ v gqlValue }

// gqlObj is an answer object whose members keep the document's order.
type gqlObj []gqlMember

type gqlMember struct {
	key string
	val any
}

func (o gqlObj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(m.val)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

type gqlExec struct {
	s    *Server
	ctx  context.Context
	p    principal
	vars map[string]any
	now  time.Time
}

func with(path []any, elems ...any) []any {
	return append(append([]any(nil), path...), elems...)
}

func (x *gqlExec) query(sels []gqlSelection) gqlObj {
	var out gqlObj
	for _, sel := range sels {
		path := []any{sel.key()}
		switch sel.name {
		case "__typename":
			noArgs(sel, path)
			out = append(out, gqlMember{sel.key(), "Query"})
		case "viewer":
			noArgs(sel, path)
			out = append(out, gqlMember{sel.key(), x.viewer(sel, path)})
		default:
			panic(gqlErr(gqlCodeValidation, path, "field %q is not supported on Query (supported: viewer)", sel.name))
		}
	}
	return out
}

func noArgs(sel gqlSelection, path []any) {
	if len(sel.args) > 0 {
		panic(gqlErr(gqlCodeValidation, path, "field %q takes no arguments", sel.name))
	}
}

func needSels(sel gqlSelection, path []any) {
	if !sel.hasSels {
		panic(gqlErr(gqlCodeValidation, path, "field %q needs a selection of subfields", sel.name))
	}
}

func noSels(sel gqlSelection, path []any) {
	if sel.hasSels {
		panic(gqlErr(gqlCodeValidation, path, "field %q is a scalar and takes no selection", sel.name))
	}
}

func (x *gqlExec) viewer(sel gqlSelection, path []any) gqlObj {
	needSels(sel, path)
	var out gqlObj
	for _, f := range sel.sels {
		fp := with(path, f.key())
		switch f.name {
		case "__typename":
			noArgs(f, fp)
			out = append(out, gqlMember{f.key(), "viewer"})
		case "accounts":
			out = append(out, gqlMember{f.key(), []gqlObj{x.account(f, fp)}})
		default:
			panic(gqlErr(gqlCodeValidation, fp, "field %q is not supported on viewer (supported: accounts)", f.name))
		}
	}
	return out
}

// account resolves accounts(filter: {accountTag}): the token's account.
func (x *gqlExec) account(sel gqlSelection, path []any) gqlObj {
	needSels(sel, path)
	var tag string
	for _, a := range sel.args {
		if a.name != "filter" {
			panic(gqlErr(gqlCodeValidation, path, "argument %q of accounts is not supported (supported: filter)", a.name))
		}
		f, ok := x.value(a.value, with(path, "filter")).(map[string]any)
		if !ok {
			panic(gqlErr(gqlCodeValidation, path, "accounts(filter:) must be an object {accountTag}"))
		}
		for k, v := range f {
			s, isStr := v.(string)
			if k != "accountTag" || !isStr {
				panic(gqlErr(gqlCodeValidation, path, "accounts(filter:) accepts only accountTag, a string"))
			}
			tag = s
		}
	}
	if tag == "" {
		panic(gqlErr(gqlCodeValidation, path, "accounts needs filter: {accountTag: \"<account id>\"}"))
	}
	if checkAccountID(tag) != nil || (!x.p.admin && tag != x.p.accountID) {
		panic(gqlErr(gqlCodeForbidden, path, "not authorized for account %q", tag))
	}
	// Validate every dataset before reading any.
	type job struct {
		sel  gqlSelection
		path []any
		run  func() []gqlObj
	}
	var jobs []job
	for _, f := range sel.sels {
		fp := with(path, 0, f.key())
		switch f.name {
		case "__typename":
			noArgs(f, fp)
			jobs = append(jobs, job{f, fp, nil})
		case "d1AnalyticsAdaptiveGroups":
			q := x.datasetArgs(f, fp, analyticsFields.orderKeys())
			analyticsFields.check(f, fp)
			jobs = append(jobs, job{f, fp, func() []gqlObj { return x.analyticsGroups(tag, f, fp, q) }})
		case "d1QueriesAdaptiveGroups":
			q := x.datasetArgs(f, fp, queriesFields.orderKeys())
			queriesFields.check(f, fp)
			x.checkQueriesSelection(f, fp, q)
			jobs = append(jobs, job{f, fp, func() []gqlObj { return x.queryGroups(tag, f, fp, q) }})
		default:
			panic(gqlErr(gqlCodeValidation, fp, "dataset %q is not supported (supported: d1AnalyticsAdaptiveGroups, d1QueriesAdaptiveGroups)", f.name))
		}
	}
	var out gqlObj
	for _, j := range jobs {
		if j.run == nil {
			out = append(out, gqlMember{j.sel.key(), "account"})
			continue
		}
		out = append(out, gqlMember{j.sel.key(), j.run()})
	}
	return out
}

// value turns a document value into Go values, substituting variables:
// numbers become int64 or float64, enums gqlEnum, lists []any, objects
// map[string]any.
func (x *gqlExec) value(v gqlValue, path []any) any {
	switch v.kind {
	case gqlVariable:
		val, ok := x.vars[v.text]
		if !ok {
			panic(gqlErr(gqlCodeValidation, path, "variable $%s is not provided", v.text))
		}
		return x.jsonValue(val, path)
	case gqlInt:
		n, err := strconv.ParseInt(v.text, 10, 64)
		if err != nil {
			panic(gqlErr(gqlCodeValidation, path, "integer %s out of range", v.text))
		}
		return n
	case gqlFloat:
		f, err := strconv.ParseFloat(v.text, 64)
		if err != nil {
			panic(gqlErr(gqlCodeValidation, path, "number %s out of range", v.text))
		}
		return f
	case gqlString:
		return v.text
	case gqlBool:
		return v.text == "true"
	case gqlNull:
		return nil
	case gqlEnumKind:
		return gqlEnum(v.text)
	case gqlList:
		out := make([]any, len(v.list))
		for i := range v.list {
			out[i] = x.value(v.list[i], with(path, i))
		}
		return out
	case gqlObject:
		out := make(map[string]any, len(v.fields))
		for _, f := range v.fields {
			if _, dup := out[f.name]; dup {
				panic(gqlErr(gqlCodeValidation, path, "field %q given twice", f.name))
			}
			out[f.name] = x.value(f.value, with(path, f.name))
		}
		return out
	}
	panic(gqlErr(gqlCodeValidation, path, "unsupported value"))
}

// jsonValue normalises a variable's JSON value like value does.
func (x *gqlExec) jsonValue(v any, path []any) any {
	switch t := v.(type) {
	case gqlLiteral:
		return x.value(t.v, path)
	case json.Number:
		if n, err := t.Int64(); err == nil {
			return n
		}
		f, err := t.Float64()
		if err != nil {
			panic(gqlErr(gqlCodeValidation, path, "number %s out of range", t))
		}
		return f
	case []any:
		out := make([]any, len(t))
		for i := range t {
			out[i] = x.jsonValue(t[i], with(path, i))
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = x.jsonValue(e, with(path, k))
		}
		return out
	}
	return v // string, bool, nil
}

type gqlEnum string

// datasetQuery is a dataset's validated arguments.
type datasetQuery struct {
	limit    int
	database string
	from, to time.Time
	order    []gqlOrder
}

type gqlOrder struct {
	key  string // e.g. "sum_rowsRead", "count", "datetimeHour"
	desc bool
}

// datasetArgs validates limit, filter and orderBy of a dataset field.
func (x *gqlExec) datasetArgs(sel gqlSelection, path []any, orderKeys map[string]bool) datasetQuery {
	needSels(sel, path)
	q := datasetQuery{}
	seen := map[string]bool{}
	for _, a := range sel.args {
		if seen[a.name] {
			panic(gqlErr(gqlCodeValidation, path, "argument %q given twice", a.name))
		}
		seen[a.name] = true
		ap := with(path, a.name)
		v := x.value(a.value, ap)
		switch a.name {
		case "limit":
			n, ok := v.(int64)
			if !ok || n < 1 || n > gqlMaxLimit {
				panic(gqlErr(gqlCodeValidation, ap, "limit must be an integer from 1 to %d", gqlMaxLimit))
			}
			q.limit = int(n)
		case "filter":
			x.filter(v, ap, &q)
		case "orderBy":
			list, ok := v.([]any)
			if !ok {
				list = []any{v} // GraphQL's input coercion: one value is a list of one
			}
			for _, e := range list {
				en, ok := e.(gqlEnum)
				if s, isStr := e.(string); isStr { // from a JSON variable
					en, ok = gqlEnum(s), true
				}
				if !ok {
					panic(gqlErr(gqlCodeValidation, ap, "orderBy takes enum values such as sum_rowsRead_DESC"))
				}
				key, desc, found := splitOrder(string(en))
				if !found || !orderKeys[key] {
					panic(gqlErr(gqlCodeValidation, ap, "orderBy %s is not supported (supported: %s, each _ASC or _DESC)", en, joinKeys(orderKeys)))
				}
				q.order = append(q.order, gqlOrder{key: key, desc: desc})
			}
		default:
			panic(gqlErr(gqlCodeValidation, ap, "argument %q of %s is not supported (supported: limit, filter, orderBy)", a.name, sel.name))
		}
	}
	if q.limit == 0 {
		panic(gqlErr(gqlCodeValidation, path, "%s needs a limit", sel.name))
	}
	if q.database == "" {
		panic(gqlErr(gqlCodeValidation, with(path, "filter"), "the filter needs databaseId: Shoal keeps D1 analytics per database"))
	}
	if q.from.IsZero() {
		panic(gqlErr(gqlCodeValidation, with(path, "filter"), "the filter needs a lower time bound (datetimeHour_geq, datetime_geq, datetimeMinute_geq or date_geq)"))
	}
	if q.to.IsZero() || q.to.After(x.now) {
		q.to = x.now
	}
	if q.to.Sub(q.from) > gqlMaxRange+time.Hour {
		panic(gqlErr(gqlCodeValidation, with(path, "filter"), "the time range is over 31 days"))
	}
	return q
}

// splitOrder splits an orderBy value "key_ASC" or "key_DESC".
func splitOrder(s string) (key string, desc, ok bool) {
	if k, found := strings.CutSuffix(s, "_DESC"); found {
		return k, true, true
	}
	k, found := strings.CutSuffix(s, "_ASC")
	return k, false, found
}

func joinKeys(m map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

// filter reads a dataset filter into q: AND of objects, each with
// databaseId and time bounds; every bound narrows the range.
func (x *gqlExec) filter(v any, path []any, q *datasetQuery) {
	f, ok := v.(map[string]any)
	if !ok {
		panic(gqlErr(gqlCodeValidation, path, "filter must be an object"))
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		val := f[k]
		kp := with(path, k)
		if k == "AND" {
			list, ok := val.([]any)
			if !ok {
				list = []any{val}
			}
			for i, e := range list {
				x.filter(e, with(kp, i), q)
			}
			continue
		}
		if k == "databaseId" {
			raw, ok := val.(string)
			s, err := canonicalUUID(raw)
			if !ok || err != nil {
				panic(gqlErr(gqlCodeValidation, kp, "databaseId must be a database UUID"))
			}
			if q.database != "" && q.database != s {
				panic(gqlErr(gqlCodeValidation, kp, "the filter names two databases; one is supported"))
			}
			q.database = s
			continue
		}
		field, op, _ := strings.Cut(k, "_")
		if op == "" {
			op = "eq" // `date: "2026-01-02"`, `datetimeHour: "…"`
		}
		var lo, hi time.Time // the bound's [lo, hi] meaning
		switch field {
		case "datetimeHour", "datetime", "datetimeMinute":
			s, ok := val.(string)
			t, err := time.Parse(time.RFC3339Nano, s)
			if !ok || err != nil {
				panic(gqlErr(gqlCodeValidation, kp, "%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z", k))
			}
			lo, hi = t, t
			if op == "eq" { // equal to a bucket: the whole hour or minute
				switch field {
				case "datetimeHour":
					lo = t.Truncate(time.Hour)
					hi = lo.Add(time.Hour - time.Millisecond)
				case "datetimeMinute":
					lo = t.Truncate(time.Minute)
					hi = lo.Add(time.Minute - time.Millisecond)
				}
			}
		case "date":
			s, ok := val.(string)
			d, err := time.Parse("2006-01-02", s)
			if !ok || err != nil {
				panic(gqlErr(gqlCodeValidation, kp, "%s must be a date such as 2026-01-02", k))
			}
			lo, hi = d, d.Add(24*time.Hour-time.Millisecond)
		default:
			panic(gqlErr(gqlCodeValidation, kp, "filter field %q is not supported (supported: AND, databaseId, and datetimeHour, datetime, datetimeMinute or date with _geq, _gt, _leq, _lt)", k))
		}
		from, to := time.Time{}, time.Time{}
		switch op {
		case "geq":
			from = lo
		case "gt":
			from = hi.Add(time.Millisecond)
		case "leq":
			to = hi
		case "lt":
			to = lo.Add(-time.Millisecond)
		case "eq":
			from, to = lo, hi
		default:
			panic(gqlErr(gqlCodeValidation, kp, "filter operator %q is not supported (supported: equality, _geq, _gt, _leq, _lt)", op))
		}
		if !from.IsZero() && (q.from.IsZero() || from.After(q.from)) {
			q.from = from
		}
		if !to.IsZero() && (q.to.IsZero() || to.Before(q.to)) {
			q.to = to
		}
	}
}

// gqlFields describes a dataset's answer objects: scalar fields at the top
// (count) and the fields of its sub-objects (sum, avg, max, dimensions),
// each computing its value from a group G. A nil value is JSON null.
type gqlFields[G any] struct {
	name    string
	leaves  map[string]func(*G) any
	objects map[string]map[string]func(*G) any
}

// orderKeys are the orderBy names: leaves by name, dimensions by name,
// other objects' fields as object_field.
func (fs gqlFields[G]) orderKeys() map[string]bool {
	keys := map[string]bool{}
	for k := range fs.leaves {
		keys[k] = true
	}
	for o, fields := range fs.objects {
		for k := range fields {
			if o == "dimensions" {
				keys[k] = true
			} else {
				keys[o+"_"+k] = true
			}
		}
	}
	return keys
}

// orderValue is the value orderBy key sorts by.
func (fs gqlFields[G]) orderValue(key string, g *G) any {
	if f, ok := fs.leaves[key]; ok {
		return f(g)
	}
	if f, ok := fs.objects["dimensions"][key]; ok {
		return f(g)
	}
	o, k, _ := strings.Cut(key, "_")
	return fs.objects[o][k](g)
}

// check validates a dataset's selection against the fields.
func (fs gqlFields[G]) check(sel gqlSelection, path []any) {
	for _, f := range sel.sels {
		fp := with(path, f.key())
		if f.name == "__typename" {
			continue
		}
		noArgs(f, fp)
		if _, ok := fs.leaves[f.name]; ok {
			noSels(f, fp)
			continue
		}
		sub, ok := fs.objects[f.name]
		if !ok {
			panic(gqlErr(gqlCodeValidation, fp, "field %q of %s is not supported (supported: %s)", f.name, fs.name, joinKeys(fs.names())))
		}
		needSels(f, fp)
		for _, s := range f.sels {
			sp := with(fp, s.key())
			noArgs(s, sp)
			noSels(s, sp)
			if _, ok := sub[s.name]; !ok && s.name != "__typename" {
				keys := map[string]bool{}
				for k := range sub {
					keys[k] = true
				}
				panic(gqlErr(gqlCodeValidation, sp, "field %q of %s.%s is not supported (supported: %s)", s.name, fs.name, f.name, joinKeys(keys)))
			}
		}
	}
}

func (fs gqlFields[G]) names() map[string]bool {
	keys := map[string]bool{}
	for k := range fs.leaves {
		keys[k] = true
	}
	for k := range fs.objects {
		keys[k] = true
	}
	return keys
}

// render answers one group along a checked selection.
func (fs gqlFields[G]) render(sel gqlSelection, g *G) gqlObj {
	var out gqlObj
	for _, f := range sel.sels {
		if f.name == "__typename" {
			out = append(out, gqlMember{f.key(), fs.name})
			continue
		}
		if leaf, ok := fs.leaves[f.name]; ok {
			out = append(out, gqlMember{f.key(), leaf(g)})
			continue
		}
		sub := fs.objects[f.name]
		var o gqlObj
		for _, s := range f.sels {
			if s.name == "__typename" {
				o = append(o, gqlMember{s.key(), fs.name + "_" + f.name})
				continue
			}
			o = append(o, gqlMember{s.key(), sub[s.name](g)})
		}
		out = append(out, gqlMember{f.key(), o})
	}
	return out
}

// dimensionsOf returns the dimension names a selection asks for.
func dimensionsOf(sel gqlSelection) map[string]bool {
	dims := map[string]bool{}
	for _, f := range sel.sels {
		if f.name == "dimensions" {
			for _, s := range f.sels {
				dims[s.name] = true
			}
		}
	}
	return dims
}

// sortGroups orders groups by the orderBy keys (values compare as
// numbers, strings, null first), stably.
func sortGroups[G any](fs gqlFields[G], groups []*G, order []gqlOrder) {
	sort.SliceStable(groups, func(i, j int) bool {
		for _, o := range order {
			c := compareValues(fs.orderValue(o.key, groups[i]), fs.orderValue(o.key, groups[j]))
			if c != 0 {
				return (c < 0) != o.desc
			}
		}
		return false
	})
}

func compareValues(a, b any) int {
	num := func(v any) (float64, bool) {
		switch t := v.(type) {
		case int64:
			return float64(t), true
		case float64:
			return t, true
		}
		return 0, false
	}
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	if x, ok := num(a); ok {
		y, _ := num(b)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	}
	return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
}

// analytics reads the source's UsageAnalytics; a missing store is an
// error, never an empty answer.
func (x *gqlExec) analytics(path []any) UsageAnalytics {
	if x.s.o.Insights == nil {
		panic(gqlErr(gqlCodeUnavailable, path, "%s", insightsNoSourceText))
	}
	ua, ok := x.s.o.Insights.(UsageAnalytics)
	if !ok {
		panic(gqlErr(gqlCodeUnavailable, path, "D1 analytics are unavailable: this edge's analytics store cannot answer GraphQL datasets"))
	}
	return ua
}

// storeFailed logs a failed read once and aborts the request.
func (x *gqlExec) storeFailed(path []any, dataset, db string, err error) {
	if x.ctx.Err() == nil {
		x.s.log.Warn("graphql analytics read failed", "request_id", requestIDFrom(x.ctx), "dataset", dataset, "database", db, "err", err)
	}
	panic(gqlErr(gqlCodeUnavailable, path, "%s", insightsUnavailableText))
}

// analyticsGroup is one group of d1AnalyticsAdaptiveGroups.
type analyticsGroup struct {
	hour     string // datetimeHour dimension, "" when not grouped by it
	date     string
	database string
	HourUsage
}

func (g *analyticsGroup) queries() int64 { return g.ReadQueries + g.WriteQueries }

var analyticsFields = gqlFields[analyticsGroup]{
	name: "d1AnalyticsAdaptiveGroups",
	leaves: map[string]func(*analyticsGroup) any{
		"count": func(g *analyticsGroup) any { return g.queries() },
	},
	objects: map[string]map[string]func(*analyticsGroup) any{
		"sum": {
			"readQueries":      func(g *analyticsGroup) any { return g.ReadQueries },
			"writeQueries":     func(g *analyticsGroup) any { return g.WriteQueries },
			"rowsRead":         func(g *analyticsGroup) any { return g.RowsRead },
			"rowsWritten":      func(g *analyticsGroup) any { return g.RowsWritten },
			"queryBatchTimeMs": func(g *analyticsGroup) any { return float64(g.DurationUs) / 1000 },
		},
		"avg": {
			"queryBatchTimeMs": func(g *analyticsGroup) any { return perQuery(float64(g.DurationUs)/1000, g.queries()) },
			"sampleInterval":   func(*analyticsGroup) any { return 1.0 }, // every query is counted: no sampling
		},
		"dimensions": {
			"datetimeHour": func(g *analyticsGroup) any { return g.hour },
			"date":         func(g *analyticsGroup) any { return g.date },
			"databaseId":   func(g *analyticsGroup) any { return g.database },
		},
	},
}

func perQuery(v float64, n int64) float64 {
	if n <= 0 {
		return 0 // a group exists only with queries; never NaN
	}
	return v / float64(n)
}

func (x *gqlExec) analyticsGroups(acct string, sel gqlSelection, path []any, q datasetQuery) []gqlObj {
	ua := x.analytics(path)
	out := []gqlObj{}
	if q.from.After(q.to) {
		return out
	}
	ctx, cancel := context.WithTimeout(x.ctx, gqlTimeout)
	defer cancel()
	hours, err := ua.HourlyUsage(ctx, acct, q.database, q.from, q.to)
	if err != nil {
		x.storeFailed(path, sel.name, q.database, err)
	}
	dims := dimensionsOf(sel)
	byKey := map[string]*analyticsGroup{}
	var groups []*analyticsGroup
	for _, h := range hours {
		g := analyticsGroup{database: q.database}
		if dims["datetimeHour"] {
			g.hour = h.Hour.UTC().Format(time.RFC3339)
		}
		if dims["date"] {
			g.date = h.Hour.UTC().Format("2006-01-02")
		}
		key := g.hour + "|" + g.date
		acc := byKey[key]
		if acc == nil {
			acc = &g
			byKey[key] = acc
			groups = append(groups, acc)
		}
		acc.ReadQueries += h.ReadQueries
		acc.WriteQueries += h.WriteQueries
		acc.RowsRead += h.RowsRead
		acc.RowsWritten += h.RowsWritten
		acc.DurationUs += h.DurationUs
	}
	sortGroups(analyticsFields, groups, q.order)
	for i, g := range groups {
		if i == q.limit {
			break
		}
		out = append(out, analyticsFields.render(sel, g))
	}
	return out
}

// queryGroup is one group of d1QueriesAdaptiveGroups: a query shape.
type queryGroup struct {
	database string
	QueryShape
}

var queriesFields = gqlFields[queryGroup]{
	name: "d1QueriesAdaptiveGroups",
	leaves: map[string]func(*queryGroup) any{
		"count": func(g *queryGroup) any { return g.Queries },
	},
	objects: map[string]map[string]func(*queryGroup) any{
		"sum": {
			"queryDurationMs": func(g *queryGroup) any { return float64(g.DurationUs) / 1000 },
			"rowsRead":        func(g *queryGroup) any { return g.RowsRead },
			"rowsWritten":     func(g *queryGroup) any { return g.RowsWritten },
			"rowsReturned":    func(*queryGroup) any { return nil }, // not recorded
		},
		"avg": {
			"queryDurationMs": func(g *queryGroup) any { return perQuery(float64(g.DurationUs)/1000, g.Queries) },
			"rowsRead":        func(g *queryGroup) any { return perQuery(float64(g.RowsRead), g.Queries) },
			"rowsWritten":     func(g *queryGroup) any { return perQuery(float64(g.RowsWritten), g.Queries) },
			"rowsReturned":    func(*queryGroup) any { return nil },
		},
		"max": {
			"queryDurationMs": func(g *queryGroup) any { return float64(g.MaxDurationUs) / 1000 },
		},
		"dimensions": {
			"query":      func(g *queryGroup) any { return g.Text },
			"databaseId": func(g *queryGroup) any { return g.database },
		},
	},
}

// queryOrders maps the orderBy keys the store can rank by.
var queryOrders = map[string]ShapeOrder{
	"count":               ShapeByCount,
	"sum_queryDurationMs": ShapeByDuration,
	"sum_rowsRead":        ShapeByRowsRead,
	"sum_rowsWritten":     ShapeByRowsWritten,
	"avg_queryDurationMs": ShapeByAvgDuration,
	"avg_rowsRead":        ShapeByAvgRowsRead,
	"avg_rowsWritten":     ShapeByAvgRowsWritten,
}

// checkQueriesSelection: the store groups by query shape only, and ranks
// by one order.
func (x *gqlExec) checkQueriesSelection(sel gqlSelection, path []any, q datasetQuery) {
	if !dimensionsOf(sel)["query"] {
		panic(gqlErr(gqlCodeValidation, path, "d1QueriesAdaptiveGroups is answered per query: select dimensions { query }"))
	}
	if len(q.order) > 1 {
		panic(gqlErr(gqlCodeValidation, with(path, "orderBy"), "one orderBy is supported"))
	}
	if len(q.order) == 1 {
		if _, ok := queryOrders[q.order[0].key]; !ok {
			keys := map[string]bool{}
			for k := range queryOrders {
				keys[k] = true
			}
			panic(gqlErr(gqlCodeValidation, with(path, "orderBy"), "orderBy %s is not supported (supported: %s, each _ASC or _DESC)", q.order[0].key, joinKeys(keys)))
		}
	}
}

func (x *gqlExec) queryGroups(acct string, sel gqlSelection, path []any, q datasetQuery) []gqlObj {
	ua := x.analytics(path)
	out := []gqlObj{}
	if q.from.After(q.to) {
		return out
	}
	order, asc := ShapeByDuration, false // default: the most time first
	if len(q.order) == 1 {
		order, asc = queryOrders[q.order[0].key], !q.order[0].desc
	}
	ctx, cancel := context.WithTimeout(x.ctx, gqlTimeout)
	defer cancel()
	shapes, err := ua.ShapesBetween(ctx, acct, q.database, q.from, q.to, order, asc, q.limit)
	if err != nil {
		x.storeFailed(path, sel.name, q.database, err)
	}
	for i := range shapes {
		if i == q.limit {
			break
		}
		out = append(out, queriesFields.render(sel, &queryGroup{database: q.database, QueryShape: shapes[i]}))
	}
	return out
}
