// The official TypeScript SDK (npm cloudflare@7.3.0, unmodified) doing
// every D1 call against Shoal: create, list, get, query, raw, export,
// import, delete. Run by wrangler_test.go:
//
//   SHOAL_BASE_URL=http://127.0.0.1:PORT/client/v4 CLOUDFLARE_API_TOKEN=…
//   CLOUDFLARE_ACCOUNT_ID=… node sdk.mjs NAME
//
// It checks what a user of the SDK relies on (fields, types, values) and
// exits non-zero on the first difference; on success it prints one JSON
// line that the Go test checks against the server's own state.
import Cloudflare from 'cloudflare';
import { createHash } from 'node:crypto';

const baseURL = process.env.SHOAL_BASE_URL;
const account_id = process.env.CLOUDFLARE_ACCOUNT_ID;
const name = process.argv[2];
const client = new Cloudflare({ apiToken: process.env.CLOUDFLARE_API_TOKEN, baseURL, maxRetries: 0 });

function check(cond, what, got) {
  if (!cond) {
    throw new Error(`${what}: got ${JSON.stringify(got)}`);
  }
}

const out = {};

// create
const db = await client.d1.database.create({ account_id, name, primary_location_hint: 'weur' });
check(typeof db.uuid === 'string' && db.uuid.length === 36, 'create: uuid', db);
check(db.name === name, 'create: name', db);
check(db.version === 'production', 'create: version', db);
check(typeof db.created_at === 'string' && !Number.isNaN(Date.parse(db.created_at)), 'create: created_at', db);
out.uuid = db.uuid;

// list (auto-paginating iterator over V4PagePaginationArray)
const listed = [];
for await (const d of client.d1.database.list({ account_id })) {
  listed.push(d);
}
const mine = listed.find((d) => d.uuid === db.uuid);
check(mine && mine.name === name, 'list: the new database', listed);
out.listed = listed.length;

// get
const got = await client.d1.database.get(db.uuid, { account_id });
check(got.uuid === db.uuid && got.name === name, 'get', got);
check(typeof got.num_tables === 'number' && typeof got.file_size === 'number', 'get: num_tables, file_size', got);

// query: a SinglePage of results, one per statement (params bind to a
// single statement, as in D1)
const q = await client.d1.database.query(db.uuid, {
  account_id,
  sql: 'CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, price REAL); SELECT count(*) AS n FROM items',
});
check(Array.isArray(q.result) && q.result.length === 2 && q.result.every((r) => r.success === true), 'query: one result per statement', q.result);
const ins = await client.d1.database.query(db.uuid, {
  account_id, sql: 'INSERT INTO items(name, price) VALUES (?, ?), (?, ?)', params: ['apple', '1.5', 'pear', '2'],
});
check(ins.result[0].meta.changes === 2 && ins.result[0].meta.rows_written >= 2, 'query: INSERT meta', ins.result[0].meta);
const sel = await client.d1.database.query(db.uuid, { account_id, sql: 'SELECT id, name, price FROM items ORDER BY id' });
const rows = sel.result[0].results;
check(rows.length === 2 && rows[0].name === 'apple' && rows[0].price === 1.5 && rows[1].id === 2, 'query: rows as objects', rows);
const meta = sel.result[0].meta;
check(typeof meta.duration === 'number' && meta.served_by_region === 'WEUR' && meta.rows_read === 2, 'query: meta', meta);
out.query_rows = rows.length;

// raw: columns and rows
const r = await client.d1.database.raw(db.uuid, { account_id, sql: 'SELECT id, name FROM items WHERE price > ?', params: ['1.6'] });
const raw = r.result[0];
check(JSON.stringify(raw.results.columns) === '["id","name"]', 'raw: columns', raw.results);
check(JSON.stringify(raw.results.rows) === '[[2,"pear"]]', 'raw: rows', raw.results);

// export: poll until complete, then download the signed URL
let exp = await client.d1.database.export(db.uuid, { account_id, output_format: 'polling' });
for (let i = 0; exp.status !== 'complete' && i < 100; i++) {
  check(exp.status !== 'error', 'export: status', exp);
  await new Promise((res) => setTimeout(res, 100));
  exp = await client.d1.database.export(db.uuid, { account_id, output_format: 'polling', current_bookmark: exp.at_bookmark });
}
check(exp.status === 'complete' && exp.success === true, 'export: complete', exp);
check(typeof exp.result?.signed_url === 'string' && typeof exp.result?.filename === 'string', 'export: result', exp);
const dump = await (await fetch(exp.result.signed_url)).text();
check(dump.startsWith('PRAGMA defer_foreign_keys=TRUE;\n'), "export: D1's header", dump.slice(0, 80));
check(!/BEGIN TRANSACTION|^COMMIT;/m.test(dump), 'export: no transaction control', dump);
check(dump.includes(`INSERT INTO "items"`), 'export: rows', dump);
out.export_bytes = dump.length;

// import the dump into a second database: init, PUT, ingest, poll
const copy = await client.d1.database.create({ account_id, name: `${name}-copy` });
out.copy_uuid = copy.uuid;
const etag = createHash('md5').update(dump).digest('hex');
const init = await client.d1.database.import(copy.uuid, { account_id, action: 'init', etag });
check(typeof init.upload_url === 'string' && typeof init.filename === 'string', 'import init', init);
const put = await fetch(init.upload_url, { method: 'PUT', body: dump });
check(put.ok, 'import upload: status', put.status);
check(put.headers.get('etag')?.replace(/"/g, '') === etag, 'import upload: ETag is the MD5', put.headers.get('etag'));
let imp = await client.d1.database.import(copy.uuid, { account_id, action: 'ingest', etag, filename: init.filename });
for (let i = 0; imp.status !== 'complete' && i < 100; i++) {
  check(imp.status !== 'error', 'import: status', imp);
  await new Promise((res) => setTimeout(res, 100));
  imp = await client.d1.database.import(copy.uuid, { account_id, action: 'poll', current_bookmark: imp.at_bookmark });
}
check(imp.status === 'complete' && imp.success === true, 'import: complete', imp);
check(imp.result?.num_queries >= 3, 'import: num_queries', imp.result);
const back = await client.d1.database.query(copy.uuid, { account_id, sql: 'SELECT count(*) AS n, sum(price) AS s FROM items' });
check(back.result[0].results[0].n === 2 && back.result[0].results[0].s === 3.5, 'import: the rows arrived', back.result[0]);
out.imported_rows = back.result[0].results[0].n;

// errors: a D1-style error with a numeric code
try {
  await client.d1.database.query(db.uuid, { account_id, sql: 'SELECT * FROM no_such_table' });
  check(false, 'query error: expected a rejection', null);
} catch (e) {
  check(e instanceof Cloudflare.APIError && e.status === 400, 'query error: APIError 400', String(e));
  check(e.errors?.[0]?.code === 7500 && /no such table/.test(e.errors[0].message), 'query error: code and message', e.errors);
}

// delete both
await client.d1.database.delete(copy.uuid, { account_id });
const del = await client.d1.database.delete(db.uuid, { account_id });
check(del === null, 'delete: null result', del);
try {
  await client.d1.database.get(db.uuid, { account_id });
  check(false, 'get after delete: expected 404', null);
} catch (e) {
  check(e instanceof Cloudflare.NotFoundError, 'get after delete: NotFoundError', String(e));
}
out.deleted = true;

console.log(JSON.stringify(out));
