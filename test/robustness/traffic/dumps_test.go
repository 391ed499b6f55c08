package traffic

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The client's own judgment of a 200 dump (Op.Malformed): a whole dump
// parses, one cut short or garbled does not pass as whole.
func TestParseDump(t *testing.T) {
	whole := dumpHeader + "\nCREATE TABLE t (v INTEGER PRIMARY KEY);\n" + exportRowPrefix + "1);\n" + exportRowPrefix + "22);\n"
	vals, bad := parseDump([]byte(whole))
	assert.Empty(t, bad)
	assert.Equal(t, []int64{1, 22}, vals)
	for name, dump := range map[string]string{
		"cut mid-line":           whole[:len(whole)-3],
		"cut before the newline": whole[:len(whole)-1],
		"cut mid-statement":      whole + exportRowPrefix + "3\n",
		"no header":              "CREATE TABLE t (v INTEGER PRIMARY KEY);\n",
		"empty":                  "",
		"garbled row":            whole + `INSERT INTO "t"("v") VALUES('x');` + "\n",
	} {
		_, bad := parseDump([]byte(dump))
		assert.NotEmpty(t, bad, name)
	}
}

// notD1 tells a D1-style answer (a result, or an error in the envelope)
// from anything else that came over HTTP.
func TestNotD1(t *testing.T) {
	env := func(status int, raw string) answer { return envelopeOf(status, []byte(raw)) }
	assert.Empty(t, env(200, `{"result":[],"success":true,"errors":[],"messages":[]}`).notD1())
	assert.Empty(t, env(503, `{"result":null,"success":false,"errors":[{"code":7503,"message":"unavailable"}],"messages":[]}`).notD1())
	assert.Empty(t, answer{}.notD1(), "no HTTP answer at all")
	assert.NotEmpty(t, env(502, `Bad Gateway`).notD1())
	assert.NotEmpty(t, env(500, `{"success":false,"errors":[]}`).notD1())
	assert.NotEmpty(t, env(500, `{"success":false,"errors":[{"code":0,"message":""}]}`).notD1())
	assert.NotEmpty(t, env(200, `{"success":false,"errors":[{"code":1,"message":"x"}]}`).notD1())
}
