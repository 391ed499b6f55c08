package shape

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOfReplacesLiteralsAndCollapsesSpace(t *testing.T) {
	cases := map[string]string{
		"SELECT * FROM t WHERE id = 7":                          "SELECT * FROM t WHERE id = ?",
		"select *\n  from t where id=42 -- c\n":                 "select * from t where id=?",
		"INSERT INTO t VALUES ('it''s', 1.5e-3, x'00ff', NULL)": "INSERT INTO t VALUES (?, ?, ?, NULL)",
		`SELECT "col 1", t2.c3 FROM [t 2] /* x */ WHERE a>-1`:   `SELECT "col 1", t2.c3 FROM [t 2] WHERE a>-?`,
		"SELECT ?1, :name, @p, $v":                              "SELECT ?1, :name, @p, $v",
	}
	for in, want := range cases {
		got, _ := Of(in)
		assert.Equal(t, want, got, "shape of %q", in)
	}
	a, ha := Of("SELECT * FROM t WHERE id = 1")
	b, hb := Of("SELECT  *  FROM t WHERE id = 99999")
	assert.Equal(t, a, b)
	assert.Equal(t, ha, hb)
	_, hc := Of("SELECT * FROM u WHERE id = 1")
	assert.NotEqual(t, ha, hc)
}

func TestOfBoundsLength(t *testing.T) {
	long := "SELECT " + string(make([]byte, 0))
	for i := 0; i < 500; i++ {
		long += "c, "
	}
	s, h1 := Of(long + "a")
	_, h2 := Of(long + "b")
	assert.LessOrEqual(t, len(s), MaxLen+8)
	assert.NotEqual(t, h1, h2, "the hash covers the whole text")
}

func FuzzOf(f *testing.F) {
	f.Add("SELECT 'a' FROM t WHERE x = 1")
	f.Add("x'")
	f.Add("/*")
	f.Fuzz(func(t *testing.T, sql string) {
		s, _ := Of(sql)
		if len(s) > MaxLen+len(sql) {
			t.Fatalf("shape longer than bound")
		}
	})
}
