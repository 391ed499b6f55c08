package edge

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// curlCmd is one curl invocation parsed from docs/api.md.
type curlCmd struct {
	method, url, data string
	headers           [][2]string
}

// shellWords splits a command line like sh: single quotes are literal, double
// quotes and bare words expand $VAR / ${VAR} from vars.
func shellWords(t *testing.T, line string, vars map[string]string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	expand := func(s string, i int) (string, int) { // s[i] == '$'
		j := i + 1
		braced := j < len(s) && s[j] == '{'
		if braced {
			j++
		}
		k := j
		for k < len(s) && (s[k] == '_' || (s[k] >= 'A' && s[k] <= 'Z') || (s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9')) {
			k++
		}
		name := s[j:k]
		if braced {
			k++
		}
		v, ok := vars[name]
		require.True(t, ok, "docs use undefined variable $%s in %q", name, line)
		return v, k
	}
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			i++
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			require.GreaterOrEqual(t, end, 0, "unterminated quote in %q", line)
			cur.WriteString(line[i+1 : i+1+end])
			inWord, i = true, i+end+2
		case c == '"':
			i++
			for i < len(line) && line[i] != '"' {
				if line[i] == '$' {
					v, n := expand(line, i)
					cur.WriteString(v)
					i = n
					continue
				}
				cur.WriteByte(line[i])
				i++
			}
			require.Less(t, i, len(line), "unterminated quote in %q", line)
			inWord, i = true, i+1
		case c == '$':
			v, n := expand(line, i)
			cur.WriteString(v)
			inWord, i = true, n
		default:
			cur.WriteByte(c)
			inWord, i = true, i+1
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// docCurlLines returns the curl commands of the ```sh blocks of docs/api.md,
// continuation lines joined, in document order.
func docCurlLines(t *testing.T) []string {
	_, self, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "docs", "api.md"))
	require.NoError(t, err)
	var out []string
	inSh := false
	pending := ""
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(l, "```"):
			inSh = false
			continue
		}
		if !inSh {
			continue
		}
		l = strings.TrimSpace(l)
		if strings.HasSuffix(l, "\\") {
			pending += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		full := pending + l
		pending = ""
		if strings.HasPrefix(full, "curl ") {
			out = append(out, full)
		}
	}
	return out
}

func parseCurl(t *testing.T, words []string) curlCmd {
	require.Equal(t, "curl", words[0])
	c := curlCmd{}
	for i := 1; i < len(words); i++ {
		switch words[i] {
		case "-X":
			i++
			c.method = words[i]
		case "-H":
			i++
			k, v, ok := strings.Cut(words[i], ":")
			require.True(t, ok, "header %q", words[i])
			c.headers = append(c.headers, [2]string{k, strings.TrimSpace(v)})
		case "-d":
			i++
			c.data = words[i]
		default:
			require.False(t, strings.HasPrefix(words[i], "-"), "unsupported curl option %q in docs", words[i])
			c.url = words[i]
		}
	}
	if c.method == "" {
		c.method = "GET"
		if c.data != "" {
			c.method = "POST"
		}
	}
	return c
}

// TestAPIDocExamples replays every curl example of docs/api.md, in order,
// against a test edge, capturing ids from answers as the docs describe.
func TestAPIDocExamples(t *testing.T) {
	e := newEnv(t)
	vars := map[string]string{"EDGE": e.ts.URL, "ADMIN_TOKEN": adminTok}
	lines := docCurlLines(t)
	require.GreaterOrEqual(t, len(lines), 14, "docs/api.md lost its examples")
	seen := map[string]bool{}
	for _, line := range lines {
		c := parseCurl(t, shellWords(t, line, vars))
		req, err := http.NewRequest(c.method, c.url, strings.NewReader(c.data))
		require.NoError(t, err)
		for _, h := range c.headers {
			req.Header.Set(h[0], h[1])
		}
		resp, err := e.ts.Client().Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, "%s\n→ %d %s", line, resp.StatusCode, raw)
		var env struct {
			Result  json.RawMessage `json:"result"`
			Success bool            `json:"success"`
		}
		require.NoError(t, json.Unmarshal(raw, &env), "%s", raw)
		require.True(t, env.Success)
		var res map[string]any
		_ = json.Unmarshal(env.Result, &res)
		path := strings.TrimPrefix(c.url, e.ts.URL)
		switch {
		case c.method == "POST" && path == "/admin/v1/accounts":
			vars["ACCOUNT_ID"] = res["id"].(string)
		case c.method == "POST" && strings.HasSuffix(path, "/tokens"):
			vars["TOKEN"], vars["TOKEN_ID"] = res["token"].(string), res["id"].(string)
		case c.method == "POST" && strings.HasSuffix(path, "/d1/database"):
			vars["DATABASE_ID"] = res["uuid"].(string)
		case c.method == "POST" && strings.HasSuffix(path, "/binding"):
			vars["BINDING_TOKEN"], vars["BINDING_TOKEN_ID"] = res["token"].(string), res["token_id"].(string)
		}
		var pairs []string
		for k, short := range map[string]string{"ACCOUNT_ID": "A", "DATABASE_ID": "D"} {
			if vars[k] != "" {
				pairs = append(pairs, vars[k], short)
			}
		}
		seen[c.method+" "+strings.Split(strings.NewReplacer(pairs...).Replace(path), "?")[0]] = true
	}
	for _, ep := range []string{
		"POST /client/v4/accounts/A/d1/database", "GET /client/v4/accounts/A/d1/database",
		"GET /client/v4/accounts/A/d1/database/D", "PATCH /client/v4/accounts/A/d1/database/D",
		"DELETE /client/v4/accounts/A/d1/database/D", "POST /client/v4/accounts/A/d1/database/D/query",
		"POST /client/v4/accounts/A/d1/database/D/raw", "POST /client/v4/accounts/A/d1/database/D/binding",
		"DELETE /client/v4/accounts/A/d1/database/D/binding",
		"POST /client/v4/bound/query", "POST /admin/v1/accounts", "GET /admin/v1/accounts/A",
		"PATCH /admin/v1/accounts/A", "POST /admin/v1/accounts/A/tokens",
		"GET /client/v4/memberships", "GET /client/v4/accounts/A/tokens/verify",
	} {
		assert.True(t, seen[ep], "docs/api.md has no example for %s", ep)
	}
}
