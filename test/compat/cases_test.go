package compat

import "fmt"

// The corpus: each case runs on a fresh database on both sides, its steps
// in order, each step one /query (or /raw) request. Setup steps are
// compared too: they are SQL like any other.

type step struct {
	Body map[string]any `json:"body"`
	Raw  bool           `json:"raw,omitempty"`
}

type testCase struct {
	Name  string `json:"name"`
	Steps []step `json:"steps"`
}

// sqls lists the step's statement strings.
func (s step) sqls() []string {
	if b, ok := s.Body["batch"].([]stmt); ok {
		out := make([]string, len(b))
		for i, x := range b {
			out[i] = x.SQL
		}
		return out
	}
	sql, _ := s.Body["sql"].(string)
	return []string{sql}
}

func q(sql string, params ...any) step {
	b := map[string]any{"sql": sql}
	if len(params) > 0 {
		b["params"] = params
	}
	return step{Body: b}
}

func raw(sql string, params ...any) step {
	s := q(sql, params...)
	s.Raw = true
	return s
}

type stmt struct {
	SQL    string `json:"sql"`
	Params []any  `json:"params,omitempty"`
}

func batch(stmts ...stmt) step { return step{Body: map[string]any{"batch": stmts}} }

func st(sql string, params ...any) stmt { return stmt{SQL: sql, Params: params} }

// Common schemas.
var (
	t5 = []step{
		q("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"),
		q("INSERT INTO t(a, b) VALUES ('a', 1), ('b', 2), ('c', 3), ('d', 4), ('e', 5)"),
	}
	t5idx = append(append([]step{}, t5...), q("CREATE INDEX t_b ON t(b)"))
	users = []step{
		q("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE, age INTEGER)"),
		q("INSERT INTO users(name, email, age) VALUES ('ann', 'ann@x', 30), ('bob', 'bob@x', 25), ('cy', 'cy@x', 41)"),
		q("CREATE TABLE posts(id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id) ON DELETE CASCADE, title TEXT)"),
		q("INSERT INTO posts(user_id, title) VALUES (1, 'p1'), (1, 'p2'), (2, 'p3'), (3, 'p4')"),
	}
	fts = []step{
		q("CREATE VIRTUAL TABLE docs USING fts5(title, body)"),
		q("INSERT INTO docs(title, body) VALUES ('hello', 'the quick brown fox'), ('bye', 'lazy dog sleeps')"),
	}
)

func with(base []step, more ...step) []step {
	return append(append([]step{}, base...), more...)
}

func c(name string, steps ...step) testCase { return testCase{Name: name, Steps: steps} }

func corpus() []testCase {
	cs := []testCase{
		// DDL
		c("ddl/create-table", q("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT)")),
		c("ddl/create-table-if-not-exists", q("CREATE TABLE t(a)"), q("CREATE TABLE IF NOT EXISTS t(a)")),
		c("ddl/create-table-exists", q("CREATE TABLE t(a)"), q("CREATE TABLE t(a)")),
		c("ddl/create-table-without-rowid", q("CREATE TABLE kv(k TEXT PRIMARY KEY, v) WITHOUT ROWID"), q("INSERT INTO kv VALUES ('a', 1), ('b', 2)"), q("SELECT * FROM kv WHERE k = 'b'")),
		c("ddl/create-table-strict", q("CREATE TABLE s(a INTEGER, b TEXT) STRICT"), q("INSERT INTO s VALUES (1, 'x')"), q("INSERT INTO s VALUES ('x', 1)")),
		c("ddl/create-table-autoincrement", q("CREATE TABLE t(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"), q("INSERT INTO t(v) VALUES (1), (2)"), q("SELECT * FROM t")),
		c("ddl/create-index-on-5-rows", with(t5, q("CREATE INDEX t_b ON t(b)"))...),
		c("ddl/create-unique-index", with(t5, q("CREATE UNIQUE INDEX t_a ON t(a)"))...),
		c("ddl/create-index-empty", q("CREATE TABLE t(a, b)"), q("CREATE INDEX t_a ON t(a)")),
		c("ddl/create-expression-index", with(t5, q("CREATE INDEX t_lower ON t(lower(a))"))...),
		c("ddl/create-partial-index", with(t5, q("CREATE INDEX t_big ON t(b) WHERE b > 2"))...),
		c("ddl/drop-table", with(t5, q("DROP TABLE t"))...),
		c("ddl/drop-table-with-index", with(t5idx, q("DROP TABLE t"))...),
		c("ddl/drop-index", with(t5idx, q("DROP INDEX t_b"))...),
		c("ddl/drop-missing", q("DROP TABLE nope")),
		c("ddl/drop-if-exists", q("DROP TABLE IF EXISTS nope")),
		c("ddl/alter-add-column", with(t5, q("ALTER TABLE t ADD COLUMN c TEXT DEFAULT 'z'"), q("SELECT c FROM t WHERE id = 1"))...),
		c("ddl/alter-rename-table", with(t5, q("ALTER TABLE t RENAME TO t2"), q("SELECT count(*) AS n FROM t2"))...),
		c("ddl/alter-rename-column", with(t5, q("ALTER TABLE t RENAME COLUMN a TO aa"), q("SELECT aa FROM t WHERE id = 2"))...),
		c("ddl/alter-drop-column", with(t5, q("ALTER TABLE t DROP COLUMN b"), q("SELECT * FROM t WHERE id = 3"))...),
		c("ddl/create-view", with(t5, q("CREATE VIEW v AS SELECT a FROM t WHERE b > 2"), q("SELECT * FROM v"))...),
		c("ddl/drop-view", with(t5, q("CREATE VIEW v AS SELECT a FROM t"), q("DROP VIEW v"))...),
		c("ddl/create-trigger", with(t5, q("CREATE TABLE log(x)"), q("CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.a); END"))...),
		c("ddl/generated-column", q("CREATE TABLE g(a INTEGER, b INTEGER GENERATED ALWAYS AS (a * 2) STORED, c AS (a + 1))"), q("INSERT INTO g(a) VALUES (3)"), q("SELECT * FROM g")),
		c("ddl/check-constraint", q("CREATE TABLE ck(a INTEGER CHECK (a > 0))"), q("INSERT INTO ck VALUES (1)"), q("INSERT INTO ck VALUES (-1)")),
		c("ddl/reindex", with(t5idx, q("REINDEX t_b"))...),
		c("ddl/analyze", with(t5idx, q("ANALYZE"))...),
		c("ddl/default-values", q("CREATE TABLE d(a DEFAULT 7, b DEFAULT (1 + 1), c DEFAULT CURRENT_DATE)"), q("INSERT INTO d DEFAULT VALUES"), q("SELECT a, b, typeof(c) AS tc FROM d")),

		// The same DDL inside the database's first request, before
		// miniflare's storage has added its own _cf_METADATA table.
		c("ddl/first-request-create-index", batch(st("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"), st("INSERT INTO t(a, b) VALUES ('a', 1), ('b', 2), ('c', 3), ('d', 4), ('e', 5)"), st("CREATE INDEX t_b ON t(b)"))),
		c("ddl/first-request-drop-table", batch(st("CREATE TABLE t(a)"), st("INSERT INTO t VALUES (1), (2)"), st("DROP TABLE t"))),
		c("ddl/first-request-rename", batch(st("CREATE TABLE t(a)"), st("ALTER TABLE t RENAME TO u"), st("ALTER TABLE u RENAME COLUMN a TO b"), st("ALTER TABLE u ADD COLUMN c"))),
		c("ddl/first-request-drop-index", batch(st("CREATE TABLE t(a)"), st("CREATE INDEX t_a ON t(a)"), st("DROP INDEX t_a"))),
		c("ddl/first-request-view-trigger", batch(st("CREATE TABLE t(a)"), st("CREATE VIEW v AS SELECT a FROM t"), st("CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END"), st("DROP TRIGGER tr"), st("DROP VIEW v"))),

		// DML
		c("dml/deferred-fk-violation", with(users, batch(st("PRAGMA defer_foreign_keys = ON"), st("INSERT INTO posts(user_id, title) VALUES (999, 'later')")))...),
		c("dml/deferred-fk-resolved", with(users, batch(st("PRAGMA defer_foreign_keys = ON"), st("INSERT INTO posts(user_id, title) VALUES (9, 'later')"), st("INSERT INTO users(id, name) VALUES (9, 'nine')")))...),
		c("dml/insert-one", with(t5, q("INSERT INTO t(a, b) VALUES ('f', 6)"))...),
		c("dml/insert-params", with(t5, q("INSERT INTO t(a, b) VALUES (?, ?)", "g", 7))...),
		c("dml/insert-numbered-params", with(t5, q("INSERT INTO t(a, b) VALUES (?2, ?1)", 8, "h"), q("SELECT a, b FROM t WHERE id = 6"))...),
		c("dml/insert-named-params", with(t5, q("INSERT INTO t(a, b) VALUES (:a, :b)", "i", 9))...),
		c("dml/insert-returning", with(t5, q("INSERT INTO t(a, b) VALUES ('x', 10) RETURNING id, a"))...),
		c("dml/insert-returning-empty-table", q("CREATE TABLE t(id INTEGER PRIMARY KEY, a)"), q("INSERT INTO t(a) VALUES ('x'), ('y') RETURNING *")),
		c("dml/insert-select", with(t5, q("CREATE TABLE t2(a, b)"), q("INSERT INTO t2 SELECT a, b FROM t WHERE b > 2"))...),
		c("dml/insert-or-ignore-dup", with(t5, q("INSERT OR IGNORE INTO t(id, a) VALUES (1, 'dup')"))...),
		c("dml/insert-or-ignore-new", with(t5, q("INSERT OR IGNORE INTO t(id, a) VALUES (99, 'new')"))...),
		c("dml/insert-or-replace-existing", with(t5, q("INSERT OR REPLACE INTO t(id, a, b) VALUES (1, 'r', 0)"))...),
		c("dml/replace-existing-indexed", with(t5idx, q("REPLACE INTO t(id, a, b) VALUES (2, 'r', 0)"))...),
		c("dml/replace-new", with(t5, q("REPLACE INTO t(id, a, b) VALUES (50, 'r', 0)"))...),
		c("dml/upsert-do-update", with(t5, q("INSERT INTO t(id, a, b) VALUES (1, 'u', 0) ON CONFLICT(id) DO UPDATE SET b = b + 100"), q("SELECT b FROM t WHERE id = 1"))...),
		c("dml/upsert-do-nothing", with(t5, q("INSERT INTO t(id, a) VALUES (1, 'u') ON CONFLICT DO NOTHING"))...),
		c("dml/upsert-new-row", with(t5, q("INSERT INTO t(id, a) VALUES (77, 'u') ON CONFLICT(id) DO UPDATE SET a = excluded.a"))...),
		c("dml/upsert-unique-column", with(users, q("INSERT INTO users(name, email, age) VALUES ('ann2', 'ann@x', 31) ON CONFLICT(email) DO UPDATE SET age = excluded.age RETURNING *"))...),
		c("dml/update-pk", with(t5, q("UPDATE t SET a = 'z' WHERE id = 3"))...),
		c("dml/update-all", with(t5, q("UPDATE t SET b = b * 10"))...),
		c("dml/update-indexed-column", with(t5idx, q("UPDATE t SET b = 42 WHERE id = 1"))...),
		c("dml/update-unindexed-column-of-indexed-table", with(t5idx, q("UPDATE t SET a = 'q' WHERE id = 1"))...),
		c("dml/update-by-index", with(t5idx, q("UPDATE t SET a = 'q' WHERE b = 4"))...),
		c("dml/update-returning", with(t5, q("UPDATE t SET b = b + 1 WHERE b >= 4 RETURNING id, b"))...),
		c("dml/update-no-match", with(t5, q("UPDATE t SET b = 0 WHERE id = 1000"))...),
		c("dml/update-same-value", with(t5idx, q("UPDATE t SET b = b WHERE id = 2"))...),
		c("dml/update-from", with(users, q("UPDATE posts SET title = users.name FROM users WHERE users.id = posts.user_id AND users.age > 28"))...),
		c("dml/delete-where", with(t5, q("DELETE FROM t WHERE b > 3"))...),
		c("dml/delete-all", with(t5, q("DELETE FROM t"))...),
		c("dml/delete-all-indexed", with(t5idx, q("DELETE FROM t"))...),
		c("dml/delete-pk", with(t5idx, q("DELETE FROM t WHERE id = 2"))...),
		c("dml/delete-returning", with(t5, q("DELETE FROM t WHERE id <= 2 RETURNING a"))...),
		c("dml/delete-cascade", with(users, q("DELETE FROM users WHERE id = 1"), q("SELECT count(*) AS n FROM posts"))...),
		c("dml/fk-violation", with(users, q("INSERT INTO posts(user_id, title) VALUES (999, 'orphan')"))...),
		c("dml/not-null-violation", with(users, q("INSERT INTO users(name) VALUES (NULL)"))...),
		c("dml/unique-violation", with(users, q("INSERT INTO users(name, email) VALUES ('x', 'bob@x')"))...),
		c("dml/pk-violation", with(t5, q("INSERT INTO t(id, a) VALUES (1, 'x')"))...),
		c("dml/insert-many-rows", q("CREATE TABLE n(x)"), q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100) INSERT INTO n SELECT i FROM c"), q("SELECT count(*) AS n, sum(x) AS s FROM n")),

		// SELECT and row reading
		c("select/literal", q("SELECT 1 AS one, 'two' AS two, 3.5 AS three, NULL AS four")),
		c("select/no-from-expression", q("SELECT 1 + 1, 'a' || 'b', 7 / 2, 7 % 3, 7.0 / 2")),
		c("select/full-scan", with(t5, q("SELECT * FROM t"))...),
		c("select/full-scan-filter", with(t5, q("SELECT a FROM t WHERE b > 2"))...),
		c("select/pk-lookup", with(t5, q("SELECT * FROM t WHERE id = 3"))...),
		c("select/pk-lookup-miss", with(t5, q("SELECT * FROM t WHERE id = 300"))...),
		c("select/pk-range", with(t5, q("SELECT id FROM t WHERE id BETWEEN 2 AND 4"))...),
		c("select/index-lookup", with(t5idx, q("SELECT a FROM t WHERE b = 3"))...),
		c("select/index-lookup-last", with(t5idx, q("SELECT a FROM t WHERE b = 5"))...),
		c("select/index-range", with(t5idx, q("SELECT a FROM t WHERE b > 1 AND b < 5"))...),
		c("select/covering-index", with(t5idx, q("SELECT b FROM t WHERE b >= 2"))...),
		c("select/order-by-unindexed", with(t5, q("SELECT a FROM t ORDER BY b DESC"))...),
		c("select/order-by-indexed", with(t5idx, q("SELECT b FROM t ORDER BY b"))...),
		c("select/order-by-limit", with(t5, q("SELECT a FROM t ORDER BY a DESC LIMIT 2"))...),
		c("select/limit-offset", with(t5, q("SELECT id FROM t LIMIT 2 OFFSET 1"))...),
		c("select/distinct", with(t5, q("INSERT INTO t(a, b) VALUES ('a', 1)"), q("SELECT DISTINCT a FROM t"))...),
		c("select/group-by", with(users, q("SELECT user_id, count(*) AS n FROM posts GROUP BY user_id"))...),
		c("select/group-by-having", with(users, q("SELECT user_id, count(*) AS n FROM posts GROUP BY user_id HAVING n > 1"))...),
		c("select/aggregates", with(t5, q("SELECT count(*) AS c, sum(b) AS s, avg(b) AS a, min(b) AS mn, max(b) AS mx, total(b) AS tt FROM t"))...),
		c("select/count-star", with(t5, q("SELECT count(*) FROM t"))...),
		c("select/count-star-empty", q("CREATE TABLE e(x)"), q("SELECT count(*) FROM e")),
		c("select/count-where", with(t5, q("SELECT count(*) FROM t WHERE b > 2"))...),
		c("select/count-subquery", with(t5, q("SELECT (SELECT count(*) FROM t) AS n"))...),
		c("select/empty-table-scan", q("CREATE TABLE e(x)"), q("SELECT * FROM e")),
		c("select/join", with(users, q("SELECT users.name, posts.title FROM users JOIN posts ON posts.user_id = users.id"))...),
		c("select/left-join", with(users, q("INSERT INTO users(name) VALUES ('dee')"), q("SELECT users.name, posts.title FROM users LEFT JOIN posts ON posts.user_id = users.id ORDER BY users.id"))...),
		c("select/cross-join", with(t5, q("SELECT count(*) AS n FROM t AS x, t AS y"))...),
		c("select/subquery-in", with(users, q("SELECT name FROM users WHERE id IN (SELECT user_id FROM posts)"))...),
		c("select/exists", with(users, q("SELECT name FROM users u WHERE EXISTS (SELECT 1 FROM posts p WHERE p.user_id = u.id)"))...),
		c("select/union", with(t5, q("SELECT a FROM t WHERE b < 2 UNION SELECT a FROM t WHERE b > 4"))...),
		c("select/union-all", with(t5, q("SELECT a FROM t WHERE b < 3 UNION ALL SELECT a FROM t WHERE b < 3"))...),
		c("select/intersect-except", with(t5, q("SELECT b FROM t INTERSECT SELECT 3"), q("SELECT b FROM t EXCEPT SELECT b FROM t WHERE b > 1"))...),
		c("select/like", with(t5, q("SELECT a FROM t WHERE a LIKE 'A%'"))...),
		c("select/glob", with(t5, q("SELECT a FROM t WHERE a GLOB '[a-c]'"))...),
		c("select/case", with(t5, q("SELECT a, CASE WHEN b % 2 = 0 THEN 'even' ELSE 'odd' END AS parity FROM t"))...),
		c("select/duplicate-column-names", with(users, q("SELECT users.id, posts.id FROM users JOIN posts ON posts.user_id = users.id WHERE posts.id = 3"))...),
		c("select/column-alias-unicode", q("SELECT 'é' AS \"naïve\", '日本' AS \"名前\"")),
		c("select/view", with(t5, q("CREATE VIEW big AS SELECT * FROM t WHERE b > 3"), q("SELECT * FROM big"))...),
		c("select/values", q("VALUES (1, 'a'), (2, 'b')")),
		c("select/raw", with(t5, raw("SELECT id, a FROM t WHERE id < 3"))...),
		c("select/raw-duplicate-columns", with(t5, raw("SELECT a, a FROM t WHERE id = 1"))...),
		c("select/raw-empty", q("CREATE TABLE e(x)"), raw("SELECT * FROM e")),
		c("select/indexed-by", with(t5idx, q("SELECT a FROM t INDEXED BY t_b WHERE b = 2"))...),
		c("select/not-indexed", with(t5idx, q("SELECT a FROM t NOT INDEXED WHERE b = 2"))...),

		// CTEs and window functions
		c("cte/simple", with(t5, q("WITH x AS (SELECT a, b FROM t WHERE b > 2) SELECT a FROM x"))...),
		c("cte/recursive-count", q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 5) SELECT i FROM c")),
		c("cte/recursive-tree", q("CREATE TABLE tree(id INTEGER PRIMARY KEY, parent INTEGER)"), q("INSERT INTO tree VALUES (1, NULL), (2, 1), (3, 1), (4, 2)"), q("WITH RECURSIVE sub(id) AS (SELECT 1 UNION ALL SELECT tree.id FROM tree JOIN sub ON tree.parent = sub.id) SELECT id FROM sub ORDER BY id")),
		c("cte/materialized", with(t5, q("WITH x AS MATERIALIZED (SELECT * FROM t) SELECT count(*) AS n FROM x"))...),
		c("window/row-number", with(t5, q("SELECT a, row_number() OVER (ORDER BY b DESC) AS rn FROM t"))...),
		c("window/running-sum", with(t5, q("SELECT b, sum(b) OVER (ORDER BY b ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS s FROM t"))...),
		c("window/partition", with(users, q("SELECT user_id, title, rank() OVER (PARTITION BY user_id ORDER BY title) AS r FROM posts"))...),
		c("window/lag-lead", with(t5, q("SELECT b, lag(b) OVER (ORDER BY b) AS prev, lead(b, 2, -1) OVER (ORDER BY b) AS nxt FROM t"))...),
		c("window/named", with(t5, q("SELECT b, avg(b) OVER w AS av FROM t WINDOW w AS (ORDER BY b ROWS 1 PRECEDING)"))...),

		// Types and values
		c("types/typeof", q("SELECT typeof(1), typeof(1.5), typeof('x'), typeof(x'00'), typeof(NULL)")),
		c("types/blob-literal", q("SELECT x'0001ff' AS b")),
		c("types/blob-roundtrip", q("CREATE TABLE b(v BLOB)"), q("INSERT INTO b VALUES (?)", []any{1, 2, 255}), q("SELECT v, length(v) AS n, hex(v) AS h FROM b")),
		c("types/empty-blob", q("SELECT x'' AS b, zeroblob(3) AS z")),
		c("types/randomblob-length", q("SELECT length(randomblob(16)) AS n")),
		c("types/float-formatting", q("SELECT 1.0 AS a, 0.1 + 0.2 AS b, 1e21 AS c, 1e-7 AS d, -0.0 AS e, 100.0 / 3 AS f")),
		c("types/integer-affinity", q("CREATE TABLE i(a INTEGER, b REAL, c TEXT, d NUMERIC, e)"), q("INSERT INTO i VALUES ('12', '12', 12, '12.0', '12')"), q("SELECT a, typeof(a) AS ta, b, typeof(b) AS tb, c, typeof(c) AS tc, d, typeof(d) AS td, e, typeof(e) AS te FROM i")),
		c("types/param-types", q("SELECT ? AS s, ? AS i, ? AS f, ? AS n, typeof(?) AS tn", "str", 42, 1.5, nil, nil)),
		c("types/param-numeric-string", q("SELECT ? + 1 AS v, typeof(?) AS t", "41", "41")),
		c("types/big-int-literal", q("SELECT 9007199254740993 AS big, -9007199254740993 AS neg")),
		c("types/max-int64", q("SELECT 9223372036854775807 AS mx, -9223372036854775808 AS mn")),
		c("types/big-int-stored", q("CREATE TABLE big(v INTEGER)"), q("INSERT INTO big VALUES (9007199254740993)"), q("SELECT v, v = 9007199254740993 AS exact, CAST(v AS TEXT) AS txt FROM big")),
		c("types/int-overflow-to-real", q("SELECT 9223372036854775807 + 1 AS v")),
		c("types/safe-int", q("SELECT 9007199254740991 AS v, 2147483648 * 2 AS w")),
		c("types/unicode-text", q("SELECT 'héllo wörld ✓ 🎉' AS s, length('🎉') AS n, unicode('é') AS u")),
		c("types/control-chars", q("SELECT char(9) || char(10) || char(0x2028) || '\"\\' AS s")),
		c("types/nan-inf", q("SELECT 1e999 AS inf, -1e999 AS ninf")),
		c("types/bool-literals", q("SELECT TRUE AS t, FALSE AS f, 1 IS TRUE AS x")),
		c("types/cast", q("SELECT CAST('12abc' AS INTEGER) AS a, CAST(3.9 AS INTEGER) AS b, CAST(5 AS TEXT) AS c, CAST('1e3' AS REAL) AS d")),
		c("types/string-escapes", q("SELECT 'it''s' AS s, \"id\" AS i FROM (SELECT 1 AS id)")),

		// Functions
		c("func/core-scalars", q("SELECT abs(-3), coalesce(NULL, 2), ifnull(NULL, 'x'), iif(1, 'y', 'n'), instr('hello', 'l'), length('abc'), lower('AB'), upper('ab'), ltrim('  a'), rtrim('a  '), trim(' a '), nullif(1, 1), replace('aXb', 'X', '-'), round(2.567, 2), sign(-4), substr('hello', 2, 3), hex('A'), quote('x'), unhex('41'), unicode('A'), char(65)")),
		c("func/printf-format", q("SELECT printf('%05d|%.2f|%s', 42, 3.14159, 'x') AS p, format('%x', 255) AS f")),
		c("func/concat", q("SELECT concat('a', 1, NULL, 'b') AS c, concat_ws('-', 'a', 'b', 'c') AS w")),
		c("func/string-agg", with(t5, q("SELECT group_concat(a) AS g, group_concat(a, ';') AS g2, string_agg(a, '+') AS s FROM t"))...),
		c("func/date-time", q("SELECT date('2024-02-28', '+1 day') AS d, time('12:34:56') AS t, datetime('2024-01-01 00:00:00', '+90 minutes') AS dt, julianday('2024-01-01') AS j, strftime('%Y-%m', '2024-03-15') AS s, unixepoch('2024-01-01') AS u")),
		c("func/timediff", q("SELECT timediff('2024-03-01', '2024-02-01') AS d")),
		c("func/math", q("SELECT sqrt(16) AS a, pow(2, 10) AS b, floor(2.7) AS c, ceil(2.1) AS d, ln(1) AS e, log10(100) AS f, log2(8) AS g, pi() > 3 AS h, mod(7, 3) AS i, trunc(-2.5) AS j")),
		c("func/trig", q("SELECT round(sin(0), 5) AS s, round(cos(0), 5) AS c, round(degrees(pi()), 5) AS d, round(atan2(1, 1), 5) AS a")),
		c("func/changes-functions", with(t5, q("UPDATE t SET b = 0 WHERE id < 3"), q("SELECT changes() AS c, total_changes() >= 2 AS tc, last_insert_rowid() AS l"))...),
		c("func/likely-likelihood", q("SELECT likely(1), unlikely(0), likelihood(1, 0.5)")),
		c("func/soundex-octet", q("SELECT soundex('Robert') AS s, octet_length('é') AS o")),
		c("func/sqlite-version", q("SELECT sqlite_version()")),
		c("func/sqlite-source-id", q("SELECT sqlite_source_id()")),
		c("func/sqlite-compileoption", q("SELECT sqlite_compileoption_used('ENABLE_FTS5')")),
		c("func/sqlite-offset", with(t5, q("SELECT sqlite_offset(a) FROM t LIMIT 1"))...),
		c("func/load-extension", q("SELECT load_extension('/tmp/x.so')")),
		c("func/fts3-tokenizer", q("SELECT fts3_tokenizer('simple')")),
		c("func/unknown-function", q("SELECT no_such_fn(1)")),
		c("func/random-typeof", q("SELECT typeof(random()) AS t")),
		c("func/uuid-like", q("SELECT length(hex(randomblob(16))) AS n")),
		c("func/regexp", q("SELECT 'abc' REGEXP 'b'")),
		c("func/percentile", q("SELECT median(1)")),

		// JSON
		c("json/extract", q(`SELECT json_extract('{"a":{"b":[1,2,3]}}', '$.a.b[1]') AS v, '{"x":1}' -> '$.x' AS arrow, '{"x":"s"}' ->> '$.x' AS arrow2`)),
		c("json/build", q(`SELECT json_object('a', 1, 'b', json_array(1, 2, 'x')) AS o, json_array_length('[1,2,3]') AS n, json_type('{"a":1}', '$.a') AS t, json_valid('{') AS v, json_quote('a"b') AS q`)),
		c("json/modify", q(`SELECT json_set('{"a":1}', '$.b', 2) AS s, json_insert('{"a":1}', '$.a', 9) AS i, json_replace('{"a":1}', '$.a', 9) AS r, json_remove('{"a":1,"b":2}', '$.a') AS d, json_patch('{"a":1}', '{"b":2}') AS p`)),
		c("json/each", q(`SELECT key, value, type FROM json_each('{"a":1,"b":[2],"c":"x"}')`)),
		c("json/tree", q(`SELECT fullkey, type FROM json_tree('{"a":{"b":1}}')`)),
		c("json/group", with(t5, q("SELECT json_group_array(a) AS arr, json_group_object(a, b) AS obj FROM t"))...),
		c("json/jsonb", q(`SELECT jsonb('{"a":1}') AS b`)),
		c("json/jsonb-extract", q(`SELECT jsonb_extract('{"a":1}', '$.a') AS v`)),
		c("json/json-pretty", q(`SELECT json_pretty('{"a":1}') AS p`)),
		c("json/column-query", q("CREATE TABLE j(doc TEXT)"), q(`INSERT INTO j VALUES ('{"name":"ann","tags":["a","b"]}'), ('{"name":"bob","tags":[]}')`), q(`SELECT doc ->> '$.name' AS name, json_array_length(doc, '$.tags') AS n FROM j WHERE json_array_length(doc, '$.tags') > 0`)),
		c("json/malformed", q(`SELECT json_extract('{bad', '$.a')`)),

		// FTS5
		c("fts5/create", q("CREATE VIRTUAL TABLE docs USING fts5(title, body)")),
		c("fts5/insert-two", with(fts[:1], fts[1])...),
		c("fts5/match", with(fts, q("SELECT title FROM docs WHERE docs MATCH 'fox'"))...),
		c("fts5/match-column", with(fts, q("SELECT title FROM docs WHERE body MATCH 'dog'"))...),
		c("fts5/rank-bm25", with(fts, q("SELECT title, round(bm25(docs), 3) < 0 AS neg FROM docs WHERE docs MATCH 'the OR dog' ORDER BY rank"))...),
		c("fts5/highlight-snippet", with(fts, q("SELECT highlight(docs, 1, '[', ']') AS h, snippet(docs, 1, '<', '>', '…', 3) AS s FROM docs WHERE docs MATCH 'quick'"))...),
		c("fts5/update", with(fts, q("UPDATE docs SET body = 'new text' WHERE title = 'hello'"))...),
		c("fts5/delete", with(fts, q("DELETE FROM docs WHERE title = 'bye'"))...),
		c("fts5/shadow-write", with(fts, q("INSERT INTO docs_data VALUES (999, x'00')"))...),
		c("fts5/shadow-read", with(fts, q("SELECT count(*) AS n FROM docs_config"))...),
		c("fts5/syntax-error", with(fts, q("SELECT * FROM docs WHERE docs MATCH 'AND'"))...),
		c("fts5/external-content", q("CREATE TABLE src(id INTEGER PRIMARY KEY, body TEXT)"), q("CREATE VIRTUAL TABLE s USING fts5(body, content='src', content_rowid='id')"), q("INSERT INTO src(body) VALUES ('alpha beta')"), q("INSERT INTO s(rowid, body) VALUES (1, 'alpha beta')"), q("SELECT rowid FROM s WHERE s MATCH 'beta'")),
		c("fts5/drop", with(fts, q("DROP TABLE docs"))...),

		// Triggers
		c("trigger/insert-fires", with(t5, q("CREATE TABLE log(x)"), q("CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.a); END"), q("INSERT INTO t(a, b) VALUES ('f', 6)"), q("SELECT * FROM log"))...),
		c("trigger/update-fires", with(t5, q("CREATE TABLE log(old, new)"), q("CREATE TRIGGER tr AFTER UPDATE OF b ON t BEGIN INSERT INTO log VALUES (old.b, new.b); END"), q("UPDATE t SET b = b + 10 WHERE id <= 2"), q("SELECT * FROM log"))...),
		c("trigger/before-delete", with(t5, q("CREATE TABLE log(x)"), q("CREATE TRIGGER tr BEFORE DELETE ON t BEGIN INSERT INTO log VALUES (old.id); END"), q("DELETE FROM t WHERE id > 3"))...),
		c("trigger/raise-abort", with(t5, q("CREATE TRIGGER tr BEFORE INSERT ON t BEGIN SELECT RAISE(ABORT, 'no inserts'); END"), q("INSERT INTO t(a) VALUES ('x')"))...),
		c("trigger/instead-of-view", with(t5, q("CREATE VIEW v AS SELECT id, a FROM t"), q("CREATE TRIGGER tr INSTEAD OF INSERT ON v BEGIN INSERT INTO t(a, b) VALUES (new.a, 0); END"), q("INSERT INTO v(a) VALUES ('via-view')"), q("SELECT a, b FROM t WHERE id = 6"))...),
		c("trigger/cascade-count", with(users, q("DELETE FROM users WHERE id = 1"))...),
		c("trigger/with-index", with(t5idx, q("CREATE TABLE log(x)"), q("CREATE INDEX log_x ON log(x)"), q("CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.b); END"), q("INSERT INTO t(a, b) VALUES ('f', 6), ('g', 7)"))...),

		// PRAGMAs
		c("pragma/table-info", with(t5, q("PRAGMA table_info(t)"))...),
		c("pragma/table-info-fn", with(t5, q("SELECT name, type FROM pragma_table_info('t')"))...),
		c("pragma/table-xinfo", with(t5, q("PRAGMA table_xinfo(t)"))...),
		c("pragma/table-list", with(t5, q("PRAGMA table_list"))...),
		c("pragma/index-list", with(t5idx, q("PRAGMA index_list(t)"))...),
		c("pragma/index-info", with(t5idx, q("PRAGMA index_info(t_b)"))...),
		c("pragma/foreign-key-list", with(users, q("PRAGMA foreign_key_list(posts)"))...),
		c("pragma/foreign-key-check", with(users, q("PRAGMA foreign_key_check"))...),
		c("pragma/foreign-keys-read", q("PRAGMA foreign_keys")),
		c("pragma/defer-foreign-keys", with(users, q("PRAGMA defer_foreign_keys = ON"))...),
		c("pragma/quick-check", q("CREATE TABLE x(a)"), q("PRAGMA quick_check")),
		c("pragma/integrity-check", q("CREATE TABLE x(a)"), q("PRAGMA integrity_check")),
		c("pragma/optimize", q("PRAGMA optimize")),
		c("pragma/journal-mode", q("PRAGMA journal_mode")),
		c("pragma/journal-mode-set", q("PRAGMA journal_mode = DELETE")),
		c("pragma/user-version", q("PRAGMA user_version")),
		c("pragma/page-size", q("PRAGMA page_size")),
		c("pragma/page-count", q("PRAGMA page_count")),
		c("pragma/compile-options", q("PRAGMA compile_options")),
		c("pragma/database-list", q("PRAGMA database_list")),
		c("pragma/writable-schema", q("PRAGMA writable_schema = ON")),
		c("pragma/case-sensitive-like", q("PRAGMA case_sensitive_like = ON")),
		c("pragma/recursive-triggers", q("PRAGMA recursive_triggers = ON")),
		c("pragma/data-version", q("PRAGMA data_version")),
		c("pragma/function-list", q("SELECT count(*) > 0 FROM pragma_function_list")),

		// Reserved names and the sandbox
		c("reserved/create-cf-table", q("CREATE TABLE _cf_x(a)")),
		c("reserved/create-cf-table-upper", q("CREATE TABLE _CF_X(a)")),
		c("reserved/read-cf-kv", q("SELECT * FROM _cf_KV")),
		c("reserved/read-cf-metadata", q("SELECT * FROM _cf_METADATA")),
		c("reserved/rename-to-cf", with(t5, q("ALTER TABLE t RENAME TO _cf_t"))...),
		c("reserved/index-cf", with(t5, q("CREATE INDEX _cf_i ON t(a)"))...),
		c("reserved/sqlite-schema-read", with(t5idx, q("SELECT type, name, tbl_name FROM sqlite_schema ORDER BY name"))...),
		c("reserved/sqlite-master-read", with(t5, q("SELECT name FROM sqlite_master WHERE type = 'table'"))...),
		c("reserved/sqlite-schema-write", with(t5, q("DELETE FROM sqlite_schema"))...),
		c("reserved/sqlite-sequence", q("CREATE TABLE t(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"), q("INSERT INTO t(v) VALUES (1)"), q("SELECT name, seq FROM sqlite_sequence"), q("UPDATE sqlite_sequence SET seq = 100")),
		c("reserved/sqlite-dbpage", q("SELECT count(*) FROM sqlite_dbpage")),
		c("reserved/attach", q("ATTACH DATABASE ':memory:' AS other")),
		c("reserved/detach", q("DETACH DATABASE main")),
		c("reserved/vacuum", q("VACUUM")),
		c("reserved/temp-table", q("CREATE TEMP TABLE tt(a)")),
		c("reserved/temp-view", q("CREATE TEMP VIEW tv AS SELECT 1")),
		c("reserved/keyword-names", q(`CREATE TABLE "select"("from" TEXT, "where" INTEGER, "order")`), q(`INSERT INTO "select" VALUES ('a', 1, 2)`), q(`SELECT "from", "where", "order" FROM "select"`)),
		c("reserved/bracket-backtick-names", q("CREATE TABLE [my table](`my col` INTEGER)"), q("INSERT INTO [my table] VALUES (1)"), q("SELECT `my col` FROM \"my table\"")),
		c("reserved/rtree", q("CREATE VIRTUAL TABLE r USING rtree(id, minx, maxx)")),
		c("reserved/fts4", q("CREATE VIRTUAL TABLE f USING fts4(x)")),
		c("reserved/dbstat", q("SELECT count(*) FROM dbstat")),
		c("reserved/generate-series", q("SELECT value FROM generate_series(1, 3)")),
		c("reserved/explain", with(t5, q("EXPLAIN SELECT * FROM t"))...),
		c("reserved/explain-query-plan", with(t5idx, q("EXPLAIN QUERY PLAN SELECT a FROM t WHERE b = 2"))...),

		// Transactions
		c("txn/begin", q("BEGIN TRANSACTION")),
		c("txn/commit", q("COMMIT")),
		c("txn/savepoint", q("SAVEPOINT sp")),
		c("txn/rollback", q("ROLLBACK")),
		c("txn/begin-in-batch", with(t5, batch(st("BEGIN"), st("DELETE FROM t")), q("SELECT count(*) AS n FROM t"))...),

		// Errors
		c("error/syntax", q("SELEC 1")),
		c("error/syntax-mid", q("SELECT * FROM WHERE")),
		c("error/syntax-end", q("SELECT 1 +")),
		c("error/syntax-offset-later", q("CREATE TABLE t(a)"), q("SELECT a FROM t WHERE a = = 1")),
		c("error/no-such-table", q("SELECT * FROM missing")),
		c("error/no-such-column", with(t5, q("SELECT nope FROM t"))...),
		c("error/ambiguous-column", with(users, q("SELECT id FROM users JOIN posts"))...),
		c("error/wrong-param-count", with(t5, q("SELECT * FROM t WHERE id = ? AND b = ?", 1))...),
		c("error/too-many-params", with(t5, q("SELECT * FROM t WHERE id = ?", 1, 2))...),
		c("error/type-mismatch-rowid", with(t5, q("INSERT INTO t(id) VALUES ('abc')"))...),
		c("error/datatype-strict", q("CREATE TABLE s(a INTEGER) STRICT"), q("INSERT INTO s VALUES ('nope')")),
		c("error/divide-by-zero-is-null", q("SELECT 1 / 0 AS v, 1 % 0 AS w")),
		c("error/too-many-columns-in-values", with(t5, q("INSERT INTO t(a) VALUES (1, 2)"))...),
		c("error/table-already-exists", with(t5, q("CREATE TABLE t(x)"))...),
		c("error/index-already-exists", with(t5idx, q("CREATE INDEX t_b ON t(a)"))...),
		c("error/view-write", with(t5, q("CREATE VIEW v AS SELECT * FROM t"), q("INSERT INTO v(a) VALUES (1)"))...),
		c("error/drop-column-indexed", with(t5idx, q("ALTER TABLE t DROP COLUMN b"))...),
		c("error/misuse-aggregate", with(t5, q("SELECT a FROM t WHERE sum(b) > 1"))...),
		c("error/group-by-window-misuse", with(t5, q("SELECT row_number() FROM t"))...),

		// Empty, comments, multi-statement
		c("empty/empty-string", q("")),
		c("empty/whitespace", q("   \n\t ")),
		c("empty/semicolon", q(";")),
		c("empty/line-comment", q("-- just a comment")),
		c("empty/line-comment-leading-space", q("  -- just a comment")),
		c("empty/block-comment", q("/* just a comment */")),
		c("empty/comment-then-select", q("-- c\nSELECT 1 AS x")),
		c("empty/select-then-comment", q("SELECT 1 AS x -- c")),
		c("empty/select-trailing-semicolons", q("SELECT 1 AS x;;")),
		c("empty/batch-with-comment-entry", batch(st("SELECT 1 AS x"), st("  -- nothing"))),
		c("empty/batch-with-empty-entry", batch(st("SELECT 1 AS x"), st(""))),
		c("multi/two-selects", q("SELECT 1 AS a; SELECT 2 AS b")),
		c("multi/ddl-and-dml", q("CREATE TABLE m(a); INSERT INTO m VALUES (1), (2); SELECT * FROM m")),
		c("multi/insert-then-count", with(t5, q("INSERT INTO t(a) VALUES ('z'); SELECT count(*) AS n FROM t"))...),
		c("multi/params-several-statements", q("SELECT ?; SELECT 2", 1)),

		// Batches and mid-request failures
		c("batch/two-inserts", with(t5, batch(st("INSERT INTO t(a) VALUES ('p')"), st("INSERT INTO t(a) VALUES (?)", "q")))...),
		c("batch/select-after-insert", with(t5, batch(st("INSERT INTO t(a, b) VALUES ('p', 9)"), st("SELECT a FROM t WHERE b = 9")))...),
		c("batch/mixed-params", with(t5, batch(st("SELECT a FROM t WHERE id = ?", 1), st("SELECT a FROM t WHERE id = ?", 2), st("SELECT count(*) AS n FROM t")))...),
		c("batch/failure-rolls-back", with(t5, batch(st("INSERT INTO t(a) VALUES ('kept?')"), st("INSERT INTO missing VALUES (1)")), q("SELECT count(*) AS n FROM t"))...),
		c("batch/constraint-mid-batch", with(t5, batch(st("DELETE FROM t WHERE id = 5"), st("INSERT INTO t(id, a) VALUES (1, 'dup')"), st("DELETE FROM t")), q("SELECT count(*) AS n FROM t"))...),
		c("batch/ddl-then-use", batch(st("CREATE TABLE bt(a)"), st("INSERT INTO bt VALUES (1)"), st("SELECT * FROM bt"))),
		c("batch/multi-statement-failure", with(t5, q("DELETE FROM t; SELECT * FROM nope"), q("SELECT count(*) AS n FROM t"))...),
		c("batch/trigger-raise-rolls-back", with(t5, q("CREATE TRIGGER tr AFTER DELETE ON t WHEN old.id = 3 BEGIN SELECT RAISE(FAIL, 'keep 3'); END"), q("DELETE FROM t"), q("SELECT count(*) AS n FROM t"))...),
		c("batch/last-row-id-across", with(t5, batch(st("INSERT INTO t(a) VALUES ('x')"), st("SELECT 1 AS one"), st("INSERT INTO t(a) VALUES ('y')")))...),
		c("batch/read-after-write-request", with(t5, q("INSERT INTO t(a) VALUES ('w')"), q("SELECT count(*) AS n FROM t WHERE a = 'w'"))...),

		// Larger tables
		c("scale/scan-1000", q("CREATE TABLE n(x INTEGER)"), q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000) INSERT INTO n SELECT i FROM c"), q("SELECT count(*) AS n FROM n WHERE x % 7 = 0")),
		c("scale/index-1000", q("CREATE TABLE n(x INTEGER)"), q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000) INSERT INTO n SELECT i FROM c"), q("CREATE INDEX n_x ON n(x)"), q("SELECT x FROM n WHERE x BETWEEN 100 AND 110")),
		c("scale/big-text", q("CREATE TABLE bt(v TEXT)"), q("INSERT INTO bt VALUES (?)", fmt.Sprintf("%01000d", 7)), q("SELECT length(v) AS n FROM bt")),
		c("scale/update-1000", q("CREATE TABLE n(x INTEGER)"), q("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000) INSERT INTO n SELECT i FROM c"), q("UPDATE n SET x = x + 1 WHERE x > 990")),
	}
	return cs
}
