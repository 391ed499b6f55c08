// d1local runs SQL cases through D1's local implementation: miniflare's D1
// database Durable Object (the one `wrangler d1 execute --local` and
// `wrangler dev` use), over its /query endpoint, the same endpoint D1's
// REST API fronts. Each case gets a database of its own.
//
// stdin:  {"cases": [{"name": "...", "steps": [{"body": {sql, params} | {batch: [...]}, "raw": bool}]}]}
// stdout: {"miniflare": "<version>", "cases": [{"name": "...", "steps": [D1Response]}]}
// where D1Response is what D1's REST API answers: {"success": true,
// "result": [{results, success, meta}]} or {"success": false,
// "errors": [{"code": 7500, "message": "..."}]}.
import { Miniflare } from "miniflare";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const input = JSON.parse(readFileSync(0, "utf8"));
const cases = input.cases;
const require = createRequire(import.meta.url);
const version = require("miniflare/package.json").version;

// A "__D1_BETA__" binding is a plain service binding to the database's
// Durable Object (miniflare's D1 plugin), so the worker sees D1's own JSON
// answer, without the Workers binding's JavaScript wrapper ("D1_ERROR: "
// prefixes, object conversion).
const d1Databases = {};
cases.forEach((_, i) => { d1Databases[`__D1_BETA__C${i}`] = `case-${i}`; });

const script = `
export default {
  async fetch(req, env) {
    const { db, body, raw } = await req.json();
    const fmt = raw ? "ROWS_AND_COLUMNS" : "ARRAY_OF_OBJECTS";
    const res = await env["__D1_BETA__C" + db].fetch("http://d1/query?resultsFormat=" + fmt, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
    });
    return new Response(await res.text(), { status: res.status });
  },
};`;

const persist = mkdtempSync(join(tmpdir(), "shoal-compat-d1-"));
const mf = new Miniflare({
  modules: true,
  script,
  d1Databases,
  d1Persist: persist,
  compatibilityDate: "2026-04-01",
});

// toDO turns a REST body into the Durable Object's: one query object, or
// an array of them for a batch.
function toDO(body) {
  if (Array.isArray(body.batch)) return body.batch.map((q) => ({ sql: q.sql, params: q.params ?? [] }));
  return { sql: body.sql, params: body.params ?? [] };
}

async function runStep(i, step) {
  const res = await mf.dispatchFetch("http://compat/", {
    method: "POST",
    body: JSON.stringify({ db: i, body: toDO(step.body), raw: !!step.raw }),
  });
  const text = await res.text();
  let v;
  try {
    v = JSON.parse(text);
  } catch {
    return { success: false, errors: [{ code: 0, message: `miniflare answered ${res.status}: ${text.slice(0, 300)}` }] };
  }
  if (Array.isArray(v)) return { success: true, result: v };
  if (v && v.success === false) return { success: false, errors: [{ code: 7500, message: v.error }] };
  return { success: false, errors: [{ code: 0, message: `unexpected answer: ${text.slice(0, 300)}` }] };
}

const out = { miniflare: version, cases: [] };
try {
  await mf.ready;
  // Cases are independent (one database each); run a few at a time.
  const results = new Array(cases.length);
  let next = 0;
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= cases.length) return;
      const steps = [];
      for (const step of cases[i].steps) steps.push(await runStep(i, step));
      results[i] = { name: cases[i].name, steps };
    }
  }
  await Promise.all([worker(), worker(), worker(), worker()]);
  out.cases = results;
} finally {
  await mf.dispose();
  rmSync(persist, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(out));
