// Package compat is Shoal's differential D1 compatibility suite: the same
// SQL cases run through D1's local implementation (miniflare's D1 Durable
// Object in Node, installed by install.sh) and through Shoal's real API (a
// `shoal dev` process: edge over HTTP, real object host, real SQLite
// files), and every difference in success, rows and their JSON types,
// error codes and messages, and meta (rows_read, rows_written, changes,
// last_row_id, changed_db, size_after) fails the test unless accepted.d.json
// lists it with its reason (docs/d1-compatibility.md explains each).
package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/shoaldb/shoal/test/harness"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestD1Compat runs the corpus on both sides and compares step by step.
// Without node or the installed miniflare it skips, or fails when
// SHOAL_REQUIRE_NODE=1 (CI). SHOAL_COMPAT_REPORT=path writes the summary
// (the figures docs/d1-compatibility.md quotes) as JSON.
func TestD1Compat(t *testing.T) {
	node := harness.RequireNode(t, ".", "miniflare")
	cases := corpus()
	require.GreaterOrEqual(t, len(cases), 150, "the corpus should stay wide")
	names := map[string]bool{}
	for _, c := range cases {
		require.False(t, names[c.Name], "duplicate case %s", c.Name)
		names[c.Name] = true
	}
	accepted := loadAccepted(t, names)

	start := time.Now()
	var d1 d1Output
	var d1Err error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d1, d1Err = runD1Local(node, cases) }()
	shoal := runShoal(t, cases)
	wg.Wait()
	require.NoError(t, d1Err)
	require.Len(t, d1.Cases, len(cases))
	if p := os.Getenv("SHOAL_COMPAT_DUMP"); p != "" {
		// Both sides' answers, for looking into a difference.
		b, _ := json.MarshalIndent(map[string]any{"d1": d1, "shoal": shoal}, "", " ")
		require.NoError(t, os.WriteFile(p, b, 0o644))
	}

	sum := summary{Miniflare: d1.Miniflare, Cases: len(cases), Kinds: map[string]int{}, AcceptedKinds: map[string]int{}}
	var unexpected []string
	used := map[string]bool{}
	for i, c := range cases {
		require.Equal(t, c.Name, d1.Cases[i].Name)
		require.Len(t, d1.Cases[i].Steps, len(c.Steps), c.Name)
		kinds := map[string][]string{}      // every difference of the case, by kind
		unaccepted := map[string][]string{} // those accepted.json does not list
		for s := range c.Steps {
			for _, d := range compareStep(d1.Cases[i].Steps[s], shoal[i][s]) {
				line := fmt.Sprintf("step %d: %s", s, d.detail)
				kinds[d.kind] = append(kinds[d.kind], line)
				if a := accepted.match(c.Name, d.kind, s, c.Steps[s].sqls()); a != "" {
					used[a] = true
				} else {
					unaccepted[d.kind] = append(unaccepted[d.kind], line)
				}
			}
		}
		sum.Steps += len(c.Steps)
		if len(kinds) == 0 {
			sum.Identical++
			continue
		}
		if _, onlyPage := kinds["meta.size_after.cf_metadata"]; onlyPage && len(kinds) == 1 {
			sum.IdenticalButMetadataPage++
		}
		allAccepted := true
		for kind := range kinds {
			sum.Kinds[kind]++
			details, bad := unaccepted[kind]
			if !bad {
				sum.AcceptedKinds[kind]++
				continue
			}
			allAccepted = false
			unexpected = append(unexpected, fmt.Sprintf("%s [%s]\n    %s", c.Name, kind, strings.Join(details, "\n    ")))
		}
		if allAccepted {
			sum.AcceptedOnly++
		} else {
			sum.Unexpected++
		}
	}
	sum.Seconds = time.Since(start).Seconds()
	t.Logf("D1 compatibility (miniflare %s): %d cases, %d steps; %d identical; %d differ only as accepted (%d of them only by the page of miniflare's _cf_METADATA table); %d differ unexpectedly; cases differing by kind %v (accepted %v); %.1f s",
		sum.Miniflare, sum.Cases, sum.Steps, sum.Identical, sum.AcceptedOnly, sum.IdenticalButMetadataPage, sum.Unexpected, sum.Kinds, sum.AcceptedKinds, sum.Seconds)
	if p := os.Getenv("SHOAL_COMPAT_REPORT"); p != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		require.NoError(t, os.WriteFile(p, b, 0o644))
	}
	for _, a := range accepted {
		if !used[a.key()] {
			t.Errorf("accepted difference no longer seen (remove it from accepted.json and the docs): %+v", a)
		}
	}
	sort.Strings(unexpected)
	if len(unexpected) > 0 {
		t.Errorf("%d differences from D1 that accepted.json does not list:\n%s", len(unexpected), strings.Join(unexpected, "\n"))
	}
}

type summary struct {
	Miniflare string `json:"miniflare"`
	Cases     int    `json:"cases"`
	Steps     int    `json:"steps"`
	Identical int    `json:"identical"`
	// IdenticalButMetadataPage: cases whose only difference is the page
	// of miniflare's own _cf_METADATA table in size_after.
	IdenticalButMetadataPage int            `json:"identical_but_cf_metadata_page"`
	AcceptedOnly             int            `json:"accepted_only"`
	Unexpected               int            `json:"unexpected"`
	Kinds                    map[string]int `json:"cases_differing_by_kind"`
	AcceptedKinds            map[string]int `json:"accepted_by_kind"`
	Seconds                  float64        `json:"seconds"`
}

// accepted.json: the differences Shoal keeps on purpose, each with its
// reason. Case is a case name or a prefix ending in "*".
type acceptance struct {
	Case string `json:"case"`
	Kind string `json:"kind"`
	// Steps, when set, limits the acceptance to these steps (0-based).
	Steps []int `json:"steps,omitempty"`
	// SQL, when set, limits it to steps with a statement starting with
	// this text (case-insensitive).
	SQL    string `json:"sql,omitempty"`
	Reason string `json:"reason"`
}

func (a acceptance) key() string { return fmt.Sprint(a.Case, "|", a.Kind, "|", a.Steps, "|", a.SQL) }

type acceptList []acceptance

func (l acceptList) match(name, kind string, step int, sqls []string) string {
	for _, a := range l {
		if a.Kind != kind || len(a.Steps) > 0 && !slices.Contains(a.Steps, step) {
			continue
		}
		if a.SQL != "" && !slices.ContainsFunc(sqls, func(s string) bool {
			s = strings.TrimSpace(s)
			return len(s) >= len(a.SQL) && strings.EqualFold(s[:len(a.SQL)], a.SQL)
		}) {
			continue
		}
		if a.Case == name || strings.HasSuffix(a.Case, "*") && strings.HasPrefix(name, strings.TrimSuffix(a.Case, "*")) {
			return a.key()
		}
	}
	return ""
}

func loadAccepted(t *testing.T, names map[string]bool) acceptList {
	t.Helper()
	b, err := os.ReadFile("accepted.json")
	require.NoError(t, err)
	var l acceptList
	require.NoError(t, json.Unmarshal(b, &l))
	for _, a := range l {
		require.NotEmpty(t, a.Reason, "accepted difference without a reason: %+v", a)
		require.Contains(t, validKinds, a.Kind, "unknown kind in accepted.json: %+v", a)
		if !strings.HasSuffix(a.Case, "*") {
			require.True(t, names[a.Case], "accepted.json names a case the corpus lacks: %s", a.Case)
		}
	}
	return l
}

var validKinds = []string{"success", "error.code", "error.message", "results", "shape",
	"meta.rows_read", "meta.rows_written", "meta.changes", "meta.last_row_id", "meta.changed_db", "meta.size_after", "meta.size_after.cf_metadata"}

// response is one /query answer in D1's REST envelope.
type response struct {
	Success bool            `json:"success"`
	Result  []stmtResult    `json:"result"`
	Errors  []responseError `json:"errors"`
}

type responseError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type stmtResult struct {
	Results json.RawMessage `json:"results"`
	Success bool            `json:"success"`
	Meta    struct {
		Changes     json.Number `json:"changes"`
		LastRowID   json.Number `json:"last_row_id"`
		ChangedDB   bool        `json:"changed_db"`
		SizeAfter   json.Number `json:"size_after"`
		RowsRead    json.Number `json:"rows_read"`
		RowsWritten json.Number `json:"rows_written"`
	} `json:"meta"`
}

type diff struct{ kind, detail string }

// compareStep lists how Shoal's answer differs from D1's.
func compareStep(d1, sh response) []diff {
	var out []diff
	if d1.Success != sh.Success {
		return []diff{{"success", fmt.Sprintf("D1 success=%v %s, Shoal success=%v %s", d1.Success, briefErr(d1), sh.Success, briefErr(sh))}}
	}
	if !d1.Success {
		de, se := firstErr(d1), firstErr(sh)
		if de.Code != se.Code {
			out = append(out, diff{"error.code", fmt.Sprintf("D1 %d, Shoal %d", de.Code, se.Code)})
		}
		if de.Message != se.Message {
			out = append(out, diff{"error.message", fmt.Sprintf("D1 %q, Shoal %q", de.Message, se.Message)})
		}
		return out
	}
	shRes := sh.Result
	if len(shRes) != len(d1.Result) {
		out = append(out, diff{"shape", fmt.Sprintf("D1 %d results, Shoal %d", len(d1.Result), len(shRes))})
		if len(d1.Result) == 1 && len(shRes) > 1 {
			// D1 answers a multi-statement string with one result: the
			// last statement's rows, counters summed. Compare that.
			shRes = []stmtResult{fold(shRes)}
		} else {
			return out
		}
	}
	for i := range d1.Result {
		a, b := d1.Result[i], shRes[i]
		if !sameJSON(a.Results, b.Results) {
			out = append(out, diff{"results", fmt.Sprintf("D1 %s, Shoal %s", clip(a.Results), clip(b.Results))})
		}
		m := func(kind string, x, y any) {
			if fmt.Sprint(x) != fmt.Sprint(y) {
				out = append(out, diff{kind, fmt.Sprintf("result %d: D1 %v, Shoal %v", i, x, y)})
			}
		}
		m("meta.rows_read", a.Meta.RowsRead, b.Meta.RowsRead)
		m("meta.rows_written", a.Meta.RowsWritten, b.Meta.RowsWritten)
		m("meta.changes", a.Meta.Changes, b.Meta.Changes)
		m("meta.last_row_id", a.Meta.LastRowID, b.Meta.LastRowID)
		m("meta.changed_db", a.Meta.ChangedDB, b.Meta.ChangedDB)
		if da, _ := a.Meta.SizeAfter.Int64(); da > 0 {
			if db, _ := b.Meta.SizeAfter.Int64(); da-db == 4096 {
				// Miniflare's Durable Object storage adds its own one-page
				// table (_cf_METADATA) on the first write.
				out = append(out, diff{"meta.size_after.cf_metadata", fmt.Sprintf("result %d: D1 %d = Shoal %d + one page", i, da, db)})
				continue
			}
		}
		m("meta.size_after", a.Meta.SizeAfter, b.Meta.SizeAfter)
	}
	return out
}

// fold is what D1 (miniflare) answers for a string of several statements:
// one result, the last statement's rows and rows read/written (the ones
// before it run while the last is prepared and are not counted), changes
// and changed_db over all of them.
func fold(rs []stmtResult) stmtResult {
	f := rs[len(rs)-1]
	var changes int64
	changed := false
	for _, r := range rs {
		n, _ := r.Meta.Changes.Int64()
		changes += n
		changed = changed || r.Meta.ChangedDB
	}
	f.Meta.Changes = json.Number(fmt.Sprint(changes))
	f.Meta.ChangedDB = changed
	return f
}

func firstErr(r response) responseError {
	if len(r.Errors) == 0 {
		return responseError{}
	}
	return r.Errors[0]
}

func briefErr(r response) string {
	if r.Success {
		return ""
	}
	e := firstErr(r)
	return fmt.Sprintf("(%d %q)", e.Code, e.Message)
}

// sameJSON compares two JSON documents value by value, numbers by their
// literal digits (so 1 and 1.0, or a rounded big integer, differ).
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if decode(a, &x) != nil || decode(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return fmt.Sprintf("%#v", x) == fmt.Sprintf("%#v", y)
}

func decode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

type d1Output struct {
	Miniflare string `json:"miniflare"`
	Cases     []struct {
		Name  string     `json:"name"`
		Steps []response `json:"steps"`
	} `json:"cases"`
}

// runD1Local runs every case through d1local.mjs (miniflare).
func runD1Local(node string, cases []testCase) (d1Output, error) {
	in, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		return d1Output{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "d1local.mjs")
	cmd.Stdin = bytes.NewReader(in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return d1Output{}, fmt.Errorf("d1local.mjs: %v: %s", err, errb.String())
	}
	var res d1Output
	if err := decode(out.Bytes(), &res); err != nil {
		return d1Output{}, fmt.Errorf("d1local.mjs output: %v: %s", err, clip(out.Bytes()))
	}
	return res, nil
}

// runShoal starts `shoal dev` and runs every case on a database of its own
// through the edge's /query and /raw.
func runShoal(t *testing.T, cases []testCase) [][]response {
	t.Helper()
	dev := startDev(t)
	out := make([][]response, len(cases))
	jobs := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, len(cases))
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				res, err := dev.runCase(i, cases[i])
				if err != nil {
					errs <- fmt.Errorf("%s: %w", cases[i].Name, err)
					continue
				}
				out[i] = res
			}
		}()
	}
	for i := range cases {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return out
}

type devServer struct {
	api, account, token string
	client              *http.Client
}

func (d *devServer) call(method, path string, body any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(method, d.api+"/client/v4/accounts/"+d.account+"/d1/database"+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func (d *devServer) runCase(i int, c testCase) ([]response, error) {
	b, err := d.call("POST", "", map[string]any{"name": fmt.Sprintf("compat-%d", i)})
	if err != nil {
		return nil, err
	}
	var created struct {
		Success bool `json:"success"`
		Result  struct {
			UUID string `json:"uuid"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &created); err != nil || !created.Success {
		return nil, fmt.Errorf("create database: %v: %s", err, b)
	}
	var res []response
	for _, s := range c.Steps {
		path := "/" + created.Result.UUID + "/query"
		if s.Raw {
			path = "/" + created.Result.UUID + "/raw"
		}
		b, err := d.call("POST", path, s.Body)
		if err != nil {
			return nil, err
		}
		var r response
		if err := decode(b, &r); err != nil {
			return nil, fmt.Errorf("answer %s: %v", clip(b), err)
		}
		res = append(res, r)
	}
	return res, nil
}

// shoalBin is built once per test binary (removed by TestMain).
var shoalBin harness.Binary

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Remove()
	os.Exit(code)
}

// startDev builds the shoal binary and runs `shoal dev` on free loopback
// ports until the test ends.
func startDev(t *testing.T) *devServer {
	t.Helper()
	bin := shoalBin.Path(t) // or $SHOAL_TEST_BIN, e.g. a baseline build
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	var errb bytes.Buffer
	cmd := exec.Command(bin, "dev", "--dir", dir, "--reset", "--addr", addr, "--base-port", fmt.Sprint(harness.DevBasePort(t)))
	cmd.Stdout, cmd.Stderr = io.Discard, &errb
	cmd.SysProcAttr = harness.ChildProcAttr()
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var info struct {
		AccountID string `json:"account_id"`
		Token     string `json:"token"`
		APIURL    string `json:"api_url"`
	}
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
		if err != nil || json.Unmarshal(b, &info) != nil || info.Token == "" {
			return false
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 100*time.Millisecond, "shoal dev never became ready: %s", &errb)
	return &devServer{api: "http://" + addr, account: info.AccountID, token: info.Token,
		client: &http.Client{Timeout: 30 * time.Second}}
}
