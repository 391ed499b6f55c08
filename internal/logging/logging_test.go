package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewFormatsAndLevels(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, "json", "warn")
	require.NoError(t, err)
	l.Info("dropped")
	l.Warn("kept", "n", 1)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec), buf.String())
	assert.Equal(t, "kept", rec["msg"])
	assert.Equal(t, "WARN", rec["level"])
	assert.Equal(t, 1.0, rec["n"])

	buf.Reset()
	l, err = New(&buf, "text", "debug")
	require.NoError(t, err)
	l.Debug("hello", "k", "v")
	assert.Contains(t, buf.String(), `level=DEBUG msg=hello k=v`)

	_, err = New(&buf, "xml", "info")
	assert.ErrorContains(t, err, "--log-format")
	_, err = New(&buf, "text", "loud")
	assert.ErrorContains(t, err, "--log-level")
}

// TestHCLogThroughSlog: what raft logs through hclog comes out as the
// process's own JSON records, with its name as the component and its
// key/value pairs as attributes; both hclog's level and the handler's
// level filter.
func TestHCLogThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, "json", "info")
	require.NoError(t, err)
	h := HCLog(l, "raft", hclog.Warn)
	h.Info("chatty") // below hclog's warn
	h.Named("wal").With("node", "n1").Warn("slow fsync", "took", "12ms", "odd")
	h.Error("failed to contact", "id", hclog.Fmt("%s-%d", "n", 2))
	h.SetLevel(hclog.Debug)
	h.Debug("below the handler's info")
	assert.False(t, h.IsDebug())
	assert.True(t, h.IsWarn())

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	var a, b map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &a))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &b))
	assert.Equal(t, map[string]any{"level": "WARN", "msg": "slow fsync", "component": "raft.wal", "node": "n1", "took": "12ms", "extra": "odd"}, drop(a, "time"))
	assert.Equal(t, map[string]any{"level": "ERROR", "msg": "failed to contact", "component": "raft", "id": "n-2"}, drop(b, "time"))

	buf.Reset()
	h.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}).Print("from std log")
	require.NoError(t, json.Unmarshal(buf.Bytes(), &a))
	assert.Equal(t, "from std log", a["msg"])
	assert.Equal(t, "ERROR", a["level"])
}

func drop(m map[string]any, k string) map[string]any {
	delete(m, k)
	return m
}
