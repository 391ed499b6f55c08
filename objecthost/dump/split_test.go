package dump

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

func splitAll(t testing.TB, r io.Reader) []Statement {
	sp := NewSplitter(r, 1<<20)
	var out []Statement
	for {
		st, err := sp.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, st)
	}
}

func nonBlank(sts []Statement) []string {
	var out []string
	for _, s := range sts {
		if !s.Blank {
			out = append(out, strings.TrimSpace(s.Raw))
		}
	}
	return out
}

func TestSplit(t *testing.T) {
	in := `-- leading comment; with semicolon
CREATE TABLE t(a TEXT DEFAULT 'x;y', "b;" INT, [c;] INT, ` + "`d;`" + ` INT); /* block ; comment */
INSERT INTO t VALUES ('it''s ; fine', 1, 2, 3);;
CREATE TRIGGER tr AFTER INSERT ON t BEGIN
  INSERT INTO t VALUES ('a', 1, 2, 3);
  UPDATE t SET a = CASE WHEN a = 'x' THEN 'y' ELSE a END;
END;
CREATE TEMP TRIGGER t2 BEFORE DELETE ON t BEGIN SELECT 1; END;
EXPLAIN SELECT 1;
SELECT 'unterminated`
	sts := splitAll(t, strings.NewReader(in))
	got := nonBlank(sts)
	require.Equal(t, []string{
		"-- leading comment; with semicolon\nCREATE TABLE t(a TEXT DEFAULT 'x;y', \"b;\" INT, [c;] INT, `d;` INT);",
		"/* block ; comment */\nINSERT INTO t VALUES ('it''s ; fine', 1, 2, 3);",
		"CREATE TRIGGER tr AFTER INSERT ON t BEGIN\n  INSERT INTO t VALUES ('a', 1, 2, 3);\n  UPDATE t SET a = CASE WHEN a = 'x' THEN 'y' ELSE a END;\nEND;",
		"CREATE TEMP TRIGGER t2 BEFORE DELETE ON t BEGIN SELECT 1; END;",
		"EXPLAIN SELECT 1;",
		"SELECT 'unterminated",
	}, got)
	require.False(t, sts[len(sts)-1].Complete)
	require.Equal(t, 2, sts[0].Line)
	var joined strings.Builder
	for _, s := range sts {
		joined.WriteString(s.Raw)
	}
	require.Equal(t, in, joined.String())
}

// FuzzSplit checks the splitter's invariants on arbitrary input: it never
// fails on text within the bound, the pieces concatenate back to the input,
// reading one byte at a time gives the same pieces, and every complete
// piece re-splits into itself alone.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{
		"SELECT 1; SELECT 2;", "CREATE TRIGGER x BEGIN SELECT 1; END; SELECT 2;",
		"'a;b'; \"c;d\"; [e;f]; `g;h`;", "-- c;\nSELECT 1; /* ; */", "/* unterminated", "'unterminated",
		"CREATE TEMPORARY TRIGGER t BEGIN END; EXPLAIN CREATE TRIGGER y BEGIN SELECT 1; END;", ";;;",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		whole := splitAll(t, strings.NewReader(in))
		bytewise := splitAll(t, iotest.OneByteReader(strings.NewReader(in)))
		require.Equal(t, whole, bytewise)
		var b strings.Builder
		for i, s := range whole {
			b.WriteString(s.Raw)
			if s.Complete {
				again := splitAll(t, strings.NewReader(s.Raw))
				require.Len(t, again, 1, "piece %d %q", i, s.Raw)
				require.Equal(t, s.Raw, again[0].Raw)
			} else {
				require.Equal(t, len(whole)-1, i, "only the last piece may be incomplete")
			}
		}
		require.Equal(t, in, b.String())
	})
}
