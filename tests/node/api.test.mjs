// stallscope's gRPC API from Node.js: @grpc/grpc-js with stock settings (4 MiB
// receive limit) and @grpc/proto-loader reading protos/stallscope/api/v1/
// stallscope.proto. Driven by tests/api/test_node_client.py, which starts a real
// daemon and an engine emitting steps and passes, in the environment:
//   STALLSCOPE_API_SOCKET   the daemon's API socket
//   STALLSCOPE_PROTO_ROOT   the repository's protos/ folder
//   STALLSCOPE_RUN_LABEL    the emitting engine's run label
// Run by hand: `node --test tests/node/` with those set.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const here = path.dirname(fileURLToPath(import.meta.url));
const socket = process.env.STALLSCOPE_API_SOCKET;
const protoRoot = process.env.STALLSCOPE_PROTO_ROOT ?? path.join(here, "..", "..", "protos");
const runLabel = process.env.STALLSCOPE_RUN_LABEL ?? "node";
assert.ok(socket, "STALLSCOPE_API_SOCKET must name the daemon's API socket");

// int64 as strings, enums as names: what a JS client does to keep 64-bit values exact.
const LOAD = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const api = grpc.loadPackageDefinition(
  protoLoader.loadSync("stallscope/api/v1/stallscope.proto", { ...LOAD, includeDirs: [protoRoot] }),
).stallscope.v1;
const reflection = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(here, "reflection_v1.proto"), LOAD),
).grpc.reflection.v1;

const target = `unix:${socket}`;
let client;

before(async () => {
  client = new api.Stallscope(target, grpc.credentials.createInsecure());
  await new Promise((ok, fail) =>
    client.waitForReady(Date.now() + 30_000, (err) => (err ? fail(err) : ok())),
  );
});

after(() => client?.close());

function unary(method, request) {
  return new Promise((ok, fail) =>
    client[method](request, { deadline: Date.now() + 30_000 }, (err, reply) =>
      err ? fail(err) : ok(reply),
    ),
  );
}

function collect(call) {
  return new Promise((ok, fail) => {
    const msgs = [];
    call.on("data", (m) => msgs.push(m));
    call.on("error", fail);
    call.on("end", () => ok(msgs));
  });
}

function query(request) {
  return collect(client.Query(request, { deadline: Date.now() + 60_000 }));
}

async function queryError(request) {
  try {
    await query(request);
  } catch (err) {
    return err;
  }
  assert.fail(`expected ${request.sql} to fail`);
}

async function runOf(label) {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const { runs } = await unary("ListRuns", {});
    const run = runs.find((r) => r.label === label);
    if (run) return run;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`no run labelled ${label}`);
}

test("reflection answers under grpc.reflection.v1", async () => {
  const refl = new reflection.ServerReflection(target, grpc.credentials.createInsecure());
  try {
    const call = refl.ServerReflectionInfo();
    const answers = collect(call);
    call.write({ list_services: "" });
    call.write({ file_containing_symbol: "stallscope.v1.Stallscope" });
    call.end();
    const [list, file] = await answers;
    const names = list.list_services_response.service.map((s) => s.name);
    for (const name of [
      "stallscope.v1.Stallscope",
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
    ]) {
      assert.ok(names.includes(name), `${name} not in ${names}`);
    }
    const protos = file.file_descriptor_response.file_descriptor_proto;
    assert.ok(protos.length >= 1);
    assert.ok(Buffer.from(protos[0]).includes(Buffer.from("stallscope.v1")));
  } finally {
    refl.close();
  }
});

test("GetStatus: wall-clock anchor, host, probe stats as JSON", async () => {
  const beforeNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
  const st = await unary("GetStatus", {});
  const afterNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
  // Node's hrtime is CLOCK_MONOTONIC on Linux, Date.now() the wall clock in ms.
  const offset = BigInt(st.realtime_offset_ns);
  assert.ok(offset >= beforeNs - 5_000_000n && offset <= afterNs + 5_000_000n, `${offset}`);
  assert.equal(st.host, os.hostname());
  assert.ok(BigInt(st.monotonic_ns) > 0n);
  for (const probe of st.probes) {
    if (probe.stats_json) {
      const typed = JSON.parse(probe.stats_json);
      assert.equal(typeof typed, "object");
    }
    for (const [key, value] of Object.entries(probe.stats)) {
      assert.ok(!/^[{[]'|MonthDayNano|^True$|^False$|^None$/.test(value), `${key}: ${value}`);
      if (/^[[{]/.test(value)) JSON.parse(value);
    }
  }
});

test("Query: a 10 MB result reaches a stock client in messages under 4 MiB", async () => {
  for (const format of ["ROWS", "ARROW_IPC"]) {
    const msgs = await query({ sql: "SELECT repeat('x', 1000) AS s FROM range(10000)", format });
    const last = msgs.at(-1);
    assert.ok(last.done);
    assert.equal(last.total_rows, "10000");
    if (format === "ROWS") {
      const rows = msgs.flatMap((m) => m.rows);
      assert.equal(rows.length, 10000);
      assert.equal(rows[0].values[0].string_value, "x".repeat(1000));
    }
    assert.ok(msgs.length >= 4, `${msgs.length} messages`);
  }
});

test("Query: values are JSON or ISO text, never language reprs", async () => {
  const msgs = await query({
    sql:
      "SELECT INTERVAL 1 MONTH + INTERVAL 3 MICROSECOND AS i, {'a': 1} AS s, " +
      "MAP {'k': 2} AS m, 1.50::DECIMAL(6, 2) AS d, TIMESTAMP '2024-05-06 07:08:09' AS t, " +
      "42::BIGINT AS n",
  });
  const v = msgs.flatMap((m) => m.rows)[0].values;
  assert.deepEqual(JSON.parse(v[0].string_value), { months: 1, days: 0, nanoseconds: 3000 });
  assert.deepEqual(JSON.parse(v[1].string_value), { a: 1 });
  assert.deepEqual(JSON.parse(v[2].string_value), [{ key: "k", value: 2 }]);
  assert.equal(v[3].string_value, "1.50");
  assert.equal(v[4].string_value, "2024-05-06T07:08:09");
  assert.equal(v[5].int_value, "42");
});

test("Query: status codes say what went wrong", async () => {
  const bad = await queryError({ sql: "SELEC 1" });
  assert.equal(bad.code, grpc.status.INVALID_ARGUMENT);
  assert.match(bad.details, /syntax error/i);
  const refused = await queryError({ sql: "DELETE FROM spans" });
  assert.equal(refused.code, grpc.status.PERMISSION_DENIED);
  const file = await queryError({ sql: "SELECT * FROM read_text('/etc/passwd')" });
  assert.equal(file.code, grpc.status.PERMISSION_DENIED);
  const slow = await queryError({
    sql: "SELECT count(*) FROM range(100000000000) a, range(1000) b",
    timeout_ms: 300,
  });
  assert.equal(slow.code, grpc.status.DEADLINE_EXCEEDED);
  assert.match(slow.details, /time limit/);
});

test("ListRuns: pages, host and realtime start", async () => {
  const run = await runOf(runLabel);
  assert.equal(run.host, os.hostname());
  const startMs = Number(BigInt(run.realtime_start_ns) / 1_000_000n);
  assert.ok(Math.abs(Date.now() - startMs) < 3_600_000, `realtime start ${startMs}`);
  const all = (await unary("ListRuns", {})).runs.map((r) => r.run_id);
  const paged = [];
  let token = "";
  do {
    const page = await unary("ListRuns", { page_size: 1, page_token: token });
    assert.ok(page.runs.length <= 1);
    paged.push(...page.runs.map((r) => r.run_id));
    token = page.next_page_token;
  } while (token);
  assert.deepEqual(paged, all);
});

test("StreamEvents: spans arrive numbered without gaps; alerts only above the minimum excess", async () => {
  const run = await runOf(runLabel);
  const call = client.StreamEvents({ kinds: ["SPAN", "STALL_ALERT"], run_ids: [run.run_id] });
  const events = [];
  await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`only ${events.length} events`)), 60_000);
    call.on("data", (batch) => {
      events.push(...batch.events);
      const alerts = events.filter((e) => e.payload === "stall_alert");
      if (events.length >= 20_000 && alerts.length >= 1) {
        clearTimeout(timer);
        ok();
      }
    });
    call.on("error", (err) => {
      if (err.code !== grpc.status.CANCELLED) fail(err);
    });
  });
  call.cancel();
  assert.deepEqual(
    events.map((e) => Number(e.seq)),
    events.map((_, i) => i),
  );
  const spans = events.filter((e) => e.payload === "span").map((e) => e.span);
  assert.ok(spans.every((s) => s.run_id === run.run_id && s.kind === "step"));
  assert.ok(spans.every((s) => BigInt(s.duration_ns) === BigInt(s.end_ns) - BigInt(s.start_ns)));
  // The engine's steps take about a microsecond, with a 5 ms stall now and
  // then: only the stalls may be alerted (excess >= 100 us), not the noise.
  const tiny = spans.filter((s) => BigInt(s.duration_ns) < 100_000n).length;
  assert.ok(tiny > 10_000, `${tiny} sub-100-us steps`);
  const alerts = events.filter((e) => e.payload === "stall_alert").map((e) => e.stall_alert);
  for (const a of alerts) {
    assert.ok(BigInt(a.duration_ns) - BigInt(a.baseline_ns) >= 100_000n, JSON.stringify(a));
  }
  assert.ok(alerts.length < tiny / 100, `${alerts.length} alerts for ${tiny} steps`);
});

test("StreamEvents: each finished request comes as RequestFinished with its latency", async () => {
  const run = await runOf(runLabel);
  const call = client.StreamEvents({ kinds: ["REQUEST_FINISHED"], run_ids: [run.run_id] });
  const events = [];
  await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`only ${events.length} events`)), 60_000);
    call.on("data", (batch) => {
      events.push(...batch.events);
      if (events.length >= 5) {
        clearTimeout(timer);
        ok();
      }
    });
    call.on("error", (err) => {
      if (err.code !== grpc.status.CANCELLED) fail(err);
    });
  });
  call.cancel();
  assert.ok(events.every((e) => e.payload === "request_finished"));
  for (const { request_finished: r } of events) {
    assert.equal(r.run_id, run.run_id);
    assert.match(r.text, /^req-\d+$/);
    assert.equal(r.end_event, "finished");
    assert.equal(r.output_tokens, "8"); // 4 token events of 2, as int64 strings
    assert.ok(BigInt(r.request_id) > 0n); // uint64, exact as a string
    // steps of ~1 us and a 10 ms sleep every 100: TTFT and e2e within a step run
    assert.ok(BigInt(r.ttft_ns) > 0n && BigInt(r.e2e_ns) >= BigInt(r.ttft_ns), JSON.stringify(r));
    assert.ok(BigInt(r.e2e_ns) < 1_000_000_000n, JSON.stringify(r));
    assert.ok(BigInt(r.itl_max_ns) >= 0n, JSON.stringify(r));
  }
});

test("StreamEvents: a reader that stops loses events, told in place with the range", async () => {
  const run = await runOf(runLabel);
  const call = client.StreamEvents({
    kinds: ["SPAN"],
    run_ids: [run.run_id],
    max_queue_events: 100,
  });
  const events = [];
  let first = true;
  call.on("data", (batch) => {
    events.push(...batch.events);
    if (first) {
      first = false;
      call.pause(); // stop reading: the daemon's queue for us fills up
    }
  });
  call.on("error", () => {});
  const deadline = Date.now() + 60_000;
  while ((await unary("GetStatus", {})).stream_events_dropped === "0") {
    assert.ok(Date.now() < deadline, "nothing was dropped while the reader stood still");
    await new Promise((r) => setTimeout(r, 200));
  }
  call.resume();
  while (!events.some((e) => e.payload === "dropped")) {
    assert.ok(Date.now() < deadline, "the loss was never told");
    await new Promise((r) => setTimeout(r, 100));
  }
  call.cancel();
  assert.deepEqual(
    events.map((e) => Number(e.seq)),
    events.map((_, i) => i),
  );
  const i = events.findIndex((e) => e.payload === "dropped");
  const d = events[i].dropped;
  assert.equal(d.reason, "subscriber_queue_full");
  assert.deepEqual(d.kinds, ["SPAN"]);
  assert.ok(BigInt(d.count) > 0n && BigInt(d.from_ns) > 0n && BigInt(d.from_ns) <= BigInt(d.to_ns));
  const before = events.slice(0, i).filter((e) => e.payload === "span");
  if (before.length) assert.ok(BigInt(before.at(-1).span.end_ns) <= BigInt(d.from_ns));
  const nextSpan = events.slice(i + 1).find((e) => e.payload === "span");
  if (nextSpan) assert.ok(BigInt(d.to_ns) <= BigInt(nextSpan.span.start_ns));
  // The range backfills through Query (the engine may still be writing: at least the count).
  // The database commits every 200 ms: ask until it holds them.
  let n = 0n;
  while (n < BigInt(d.count) && Date.now() < deadline + 10_000) {
    const msgs = await query({
      sql: "SELECT count(*) FROM spans WHERE run_id = ? AND start_ns >= ? AND end_ns <= ?",
      params: [{ int_value: run.run_id }, { int_value: d.from_ns }, { int_value: d.to_ns }],
    });
    n = BigInt(msgs.flatMap((m) => m.rows)[0].values[0].int_value);
    if (n < BigInt(d.count)) await new Promise((r) => setTimeout(r, 200));
  }
  assert.ok(n >= BigInt(d.count), `backfill found ${n} of ${d.count}`);
});
