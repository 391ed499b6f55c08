-- Hostile corpus for TestHostileCorpus: one request per line (a line may
-- hold several statements; the whole request must be refused). Lines
-- starting with "--" are comments. The fixture holds: table victim
-- (AUTOINCREMENT), FTS5 table ftsv, and _shoal_meta created by the host.
ATTACH '/etc/passwd' AS p
ATTACH DATABASE ':memory:' AS m
ATTACH DATABASE 'file:/tmp/shoal-hostile-attach.db?mode=rwc' AS m
DETACH DATABASE main
VACUUM INTO '/tmp/shoal-hostile-vacuum.db'
VACUUM
SELECT load_extension('x')
SELECT load_extension('/usr/lib/x86_64-linux-gnu/libsqlite3.so.0', 'sqlite3_extension_init')
SELECT fts3_tokenizer('simple')
SELECT readfile('/etc/passwd')
SELECT writefile('/tmp/shoal-hostile-writefile', 'y')
PRAGMA writable_schema=1
PRAGMA writable_schema
PRAGMA journal_mode=DELETE
PRAGMA main.journal_mode=OFF
PRAGMA journal_mode
PRAGMA synchronous=OFF
PRAGMA temp_store_directory='/tmp'
PRAGMA mmap_size=1000000
PRAGMA database_list
PRAGMA compile_options
PRAGMA cache_size=-1000000
PRAGMA max_page_count=1
PRAGMA page_size=512
PRAGMA locking_mode=EXCLUSIVE
PRAGMA query_only=0
PRAGMA trusted_schema=1
PRAGMA cell_size_check=0
PRAGMA wal_checkpoint(TRUNCATE)
PRAGMA user_version=5
PRAGMA table_info(_shoal_meta)
SELECT * FROM pragma_database_list
SELECT * FROM pragma_compile_options
SELECT * FROM pragma_table_info('_shoal_meta')
CREATE TABLE _cf_x(a)
CREATE TABLE _CF_KV(a)
CREATE TABLE _shoal_x(a)
CREATE TABLE IF NOT EXISTS _shoal_meta(a)
INSERT INTO _shoal_meta VALUES ('owner', 'evil')
UPDATE _shoal_meta SET v = 'evil'
DELETE FROM _shoal_meta
DROP TABLE _shoal_meta
SELECT * FROM _shoal_meta
SELECT * FROM main._SHOAL_META
CREATE VIRTUAL TABLE _cf_f USING fts5(x)
CREATE VIRTUAL TABLE _cf USING fts5(x)
CREATE VIRTUAL TABLE _shoal USING fts5(x)
ALTER TABLE victim RENAME TO _cf_victim
ALTER TABLE _shoal_meta RENAME TO mine
ALTER TABLE _shoal_meta ADD COLUMN evil
CREATE INDEX _cf_i ON victim(b)
CREATE INDEX i_meta ON _shoal_meta(k)
CREATE TRIGGER t_meta AFTER INSERT ON _shoal_meta BEGIN SELECT 1; END
CREATE TRIGGER trg AFTER INSERT ON victim BEGIN INSERT INTO _shoal_meta VALUES ('owner', 'evil'); END; INSERT INTO victim(b) VALUES (1)
CREATE TRIGGER trg2 AFTER INSERT ON victim BEGIN SELECT load_extension('x'); END; INSERT INTO victim(b) VALUES (2)
CREATE VIEW v_meta AS SELECT * FROM _shoal_meta; SELECT * FROM v_meta
CREATE TEMP TABLE tt(a)
CREATE TEMP VIEW tv AS SELECT 1
CREATE TEMP TRIGGER ttr AFTER INSERT ON victim BEGIN SELECT 1; END
INSERT INTO sqlite_sequence VALUES ('victim', 100)
UPDATE sqlite_sequence SET seq = 1000
DELETE FROM sqlite_sequence
ANALYZE; DELETE FROM sqlite_stat1
CREATE TABLE s(a); INSERT INTO sqlite_stat1 VALUES ('victim', NULL, '1')
INSERT INTO sqlite_master VALUES ('table', 'x', 'x', 0, 'CREATE TABLE x(a)')
UPDATE sqlite_schema SET sql = 'CREATE TABLE victim(zzz)' WHERE name = 'victim'
DELETE FROM sqlite_master WHERE name = 'victim'
INSERT INTO ftsv_data VALUES (99, x'00')
UPDATE ftsv_config SET v = 1
DELETE FROM ftsv_idx
DROP TABLE ftsv_data
ALTER TABLE ftsv_data RENAME TO x
CREATE TRIGGER shadow_trg AFTER INSERT ON victim BEGIN DELETE FROM ftsv_data; END; INSERT INTO victim(b) VALUES (3)
SELECT * FROM sqlite_dbpage
SELECT * FROM dbstat
BEGIN
BEGIN IMMEDIATE TRANSACTION
COMMIT
ROLLBACK
END
SAVEPOINT a
RELEASE a
INSERT INTO victim(b) VALUES ('ok'); BEGIN
INSERT INTO victim(b) VALUES ('ok'); COMMIT; INSERT INTO victim(b) VALUES ('after')
INSERT INTO victim(b) VALUES ('ok'); ROLLBACK
