package test

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// devBanner extracts what a new user copies from `shoal dev`'s banner: the
// export line and each curl command (joining '\' continuation lines).
func devBanner(t *testing.T, out string) (export string, cmds []string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "export SHOAL_"):
			export = l
		case strings.HasPrefix(l, "curl "):
			c := l
			for strings.HasSuffix(c, `\`) && i+1 < len(lines) {
				i++
				c = strings.TrimSuffix(c, `\`) + " " + strings.TrimSpace(lines[i])
			}
			cmds = append(cmds, c)
		}
	}
	require.NotEmpty(t, export, "banner has no export line:\n%s", out)
	require.Len(t, cmds, 3, "banner should show create, query and list:\n%s", out)
	return export, cmds
}

// TestReadmeFlow is the first five minutes of a new user: start `shoal dev`,
// copy the three printed commands (create, query, list) into a shell, and
// see each one succeed.
func TestReadmeFlow(t *testing.T) {
	// The flow is the README's shell commands; scripts/deps.sh (run by
	// `make test`) installs curl.
	_, err := exec.LookPath("curl")
	require.NoError(t, err, "curl is needed: run scripts/deps.sh")
	bin := shoalBin.Path(t)
	dev := startDev(t, bin)
	export, cmds := devBanner(t, dev.output())
	require.Contains(t, export, dev.apiURL)

	sh := func(c string) map[string]any {
		t.Helper()
		out, err := exec.Command("sh", "-c", export+"\n"+c).CombinedOutput()
		require.NoError(t, err, "%s: %s", c, out)
		var env map[string]any
		require.NoError(t, json.Unmarshal(out, &env), "%s: %s", c, out)
		require.Equal(t, true, env["success"], "%s: %s", c, out)
		return env
	}

	created := sh(cmds[0])
	uuid := created["result"].(map[string]any)["uuid"].(string)
	require.Regexp(t, `^[0-9a-f-]{36}$`, uuid)

	require.Contains(t, cmds[1], "<uuid>")
	q := sh(strings.ReplaceAll(cmds[1], "<uuid>", uuid))
	res := q["result"].([]any)
	last := res[len(res)-1].(map[string]any)["results"].([]any)
	require.Len(t, last, 2)
	require.EqualValues(t, 1, last[0].(map[string]any)["x"])

	list := sh(cmds[2])
	names := regexp.MustCompile(`"name":"([^"]+)"`).FindAllStringSubmatch(mustJSON(list["result"]), -1)
	require.Len(t, names, 1)
	require.Equal(t, "my-first-db", names[0][1])
}
