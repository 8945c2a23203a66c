// nats.js (`nats` on npm) against skiff nodes' NATS listeners, run by
// tests/nats/run.sh with the environment it documents (NATS_A, NATS_B
// meshed; SKIFF_A; SKIFF; NATS_C, NATS_D, KILL_C).
"use strict";
const { connect, headers, ErrorCode } = require("nats");
const { execFile, spawn } = require("child_process");
const crypto = require("crypto");

const E = process.env;
const enc = new TextEncoder();
const dec = new TextDecoder();
let passed = 0;

function check(ok, what) {
  if (!ok) {
    console.log(`FAIL nats.js: ${what}`);
    process.exit(1);
  }
  passed++;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(pred, what) {
  for (let i = 0; i < 200; i++) {
    if (pred()) return;
    await sleep(25);
  }
  check(false, `timed out: ${what}`);
}
function skiff(...args) {
  return new Promise((resolve, reject) =>
    execFile(E.SKIFF, args, { timeout: 15000 }, (err, out) => (err ? reject(err) : resolve(out))));
}
async function collect(nc, subject, queue) {
  const got = [];
  const sub = nc.subscribe(subject, { queue, callback: (err, m) => { if (!err) got.push(m); } });
  await nc.flush();
  return [sub, got];
}
async function ask(nc, subject, data) {
  for (let i = 0; i < 100; i++) {
    try {
      return await nc.request(subject, enc.encode(data), { timeout: 1000 });
    } catch (e) {
      await sleep(25);
    }
  }
  return null;
}

async function local(nc) {
  const [, star] = await collect(nc, "js.*.x");
  const [, tail] = await collect(nc, "js.>");
  for (const s of ["js.a.x", "js.b.x", "js.a.y", "other"]) nc.publish(s, enc.encode(s));
  await until(() => star.length === 2 && tail.length === 3, "wildcards");

  const [, q1] = await collect(nc, "js.q", "workers");
  const [, q2] = await collect(nc, "js.q", "workers");
  for (let i = 0; i < 100; i++) nc.publish("js.q", enc.encode(String(i)));
  await until(() => q1.length + q2.length === 100, "queue group");
  check(q1.length > 0 && q2.length > 0, `both queue members got messages (${q1.length}, ${q2.length})`);
  const seen = [...q1, ...q2].map((m) => Number(dec.decode(m.data))).sort((a, b) => a - b);
  check(seen.every((v, i) => v === i), "each message once to the group");

  nc.subscribe("js.svc", { callback: (err, m) => m.respond(enc.encode("re:" + dec.decode(m.data))) });
  const r = await nc.request("js.svc", enc.encode("one"), { timeout: 3000 });
  check(dec.decode(r.data) === "re:one", "request/reply");
  try {
    await nc.request("nobody.js", enc.encode("x"), { timeout: 3000 });
    check(false, "no responders error");
  } catch (e) {
    check(e.code === ErrorCode.NoResponders, `no responders: ${e.code}`);
  }

  const [, h] = await collect(nc, "js.h");
  const hs = headers();
  hs.set("Trace-Id", "abc");
  nc.publish("js.h", enc.encode("b"), { headers: hs });
  await until(() => h.length === 1, "headers");
  check(h[0].headers && h[0].headers.get("Trace-Id") === "abc", "headers kept");

  const got3 = [];
  const s3 = nc.subscribe("js.max3", { callback: (err, m) => got3.push(m) });
  s3.unsubscribe(3);
  await nc.flush();
  for (let i = 0; i < 10; i++) nc.publish("js.max3", enc.encode("m"));
  await nc.flush();
  await sleep(300);
  check(got3.length === 3, `UNSUB 3 delivered ${got3.length}`);

  const big = crypto.randomBytes(1000 * 1000);
  const [, b] = await collect(nc, "js.big");
  nc.publish("js.big", big);
  await until(() => b.length === 1, "large payload");
  check(Buffer.compare(Buffer.from(b[0].data), big) === 0, "large payload intact");

  const nc2 = await connect({ servers: E.NATS_A });
  const [, d] = await collect(nc2, "js.drain");
  for (let i = 0; i < 50; i++) nc.publish("js.drain", enc.encode("d"));
  await nc.flush();
  await sleep(200);
  await nc2.drain();
  check(d.length === 50, `drain delivered ${d.length} of 50`);
}

async function interop(nc) {
  const a = E.SKIFF_A;
  const [, got] = await collect(nc, "js.s2n");
  await skiff("pub", "-n", a, "js.s2n", "from-skiff", "--type", "greet");
  await until(() => got.length === 1, "skiff pub -> nats sub");
  check(dec.decode(got[0].data) === "from-skiff" && got[0].headers && got[0].headers.get("Skiff-Type") === "greet",
    "skiff message with its type as a header");

  const p = spawn(E.SKIFF, ["sub", "-n", a, "js.n2s", "--count", "1"]);
  let out = "";
  p.stdout.on("data", (c) => (out += c));
  let exited = false;
  p.on("exit", () => (exited = true));
  for (let i = 0; i < 200 && !exited; i++) {
    nc.publish("js.n2s", enc.encode("from-nats"));
    await sleep(25);
  }
  await until(() => exited, "skiff sub exits");
  check(out.includes("from-nats"), `nats pub -> skiff sub: ${out}`);

  nc.subscribe("js.ask-nats", { callback: (err, m) => m.respond(enc.encode("nats-answer")) });
  await nc.flush();
  const res = await skiff("req", "-n", a, "js.ask-nats", "q");
  check(res.includes("nats-answer"), `skiff req -> nats: ${res}`);

  const rep = spawn(E.SKIFF, ["reply", "-n", a, "js.ask-skiff", "skiff-answer", "--count", "1"]);
  const r = await ask(nc, "js.ask-skiff", "q");
  check(r && dec.decode(r.data) === "skiff-answer", "nats req -> skiff reply");
  rep.kill();
}

async function mesh() {
  const a = await connect({ servers: E.NATS_A });
  const b = await connect({ servers: E.NATS_B });
  const [, got] = await collect(b, "js.mesh");
  b.subscribe("js.mesh.svc", { callback: (err, m) => m.respond(enc.encode("from-b")) });
  await b.flush();
  for (let i = 0; i < 200 && got.length === 0; i++) {
    a.publish("js.mesh", enc.encode("x"));
    await sleep(25);
  }
  check(got.length > 0, "nats A -> nats B across the mesh");
  const r = await ask(a, "js.mesh.svc", "q");
  check(r && dec.decode(r.data) === "from-b", "request across the mesh");
  await a.close();
  await b.close();
}

async function secure() {
  let refused = false;
  try {
    const nc = await connect({ servers: E.NATS_TLS, reconnect: false });
    await nc.close();
  } catch (e) {
    refused = true;
  }
  check(refused, "a client without the node's CA refused on a TLS port");
  const nc = await connect({ servers: E.NATS_TLS, tls: { caFile: E.NATS_CA } });
  const [, got] = await collect(nc, "js.tls.*");
  nc.subscribe("js.tlssvc", { callback: (err, m) => m.respond(enc.encode("tls:" + dec.decode(m.data))) });
  nc.publish("js.tls.x", enc.encode("secret"));
  await until(() => got.length === 1, "publish/subscribe over TLS");
  check(dec.decode(got[0].data) === "secret", "payload over TLS");
  const r = await nc.request("js.tlssvc", enc.encode("q"), { timeout: 3000 });
  check(dec.decode(r.data) === "tls:q", "request over TLS");
  await nc.close();
  const first = await connect({ servers: E.NATS_TLS_FIRST, tls: { caFile: E.NATS_CA, handshakeFirst: true } });
  const [, f] = await collect(first, "js.first");
  first.publish("js.first", enc.encode("f"));
  await until(() => f.length === 1, "handshake_first");
  await first.close();
}

async function auth() {
  const url = E.NATS_AUTH;
  for (const bad of [{}, { token: "nope" }, { user: "alice", pass: "nope" }]) {
    let refused = false;
    try {
      const nc = await connect({ servers: url, reconnect: false, ...bad });
      await nc.close();
    } catch (e) {
      refused = true;
    }
    check(refused, `refused: ${JSON.stringify(bad)}`);
  }
  const tok = await connect({ servers: url, token: "tok" });
  const [, got] = await collect(tok, "alice.>");
  const alice = await connect({ servers: url, user: "alice", pass: "alice-pw" });
  alice.publish("alice.js", enc.encode("ok"));
  await until(() => got.length === 1, "alice's publish");
  await alice.close();
  await tok.close();
}

async function reconnect() {
  const nc = await connect({ servers: [E.NATS_C, E.NATS_D], noRandomize: true, reconnectTimeWait: 100, maxReconnectAttempts: 50 });
  const [, got] = await collect(nc, "js.re");
  let reconnected = false;
  (async () => {
    for await (const s of nc.status()) if (s.type === "reconnect") reconnected = true;
  })();
  process.kill(Number(E.KILL_C), "SIGKILL");
  await until(() => reconnected, "reconnect");
  check(nc.getServer().endsWith(E.NATS_D.split(":").pop()), `reconnected to the second node: ${nc.getServer()}`);
  nc.publish("js.re", enc.encode("after"));
  await until(() => got.length > 0, "subscription restored after reconnect");
  await nc.close();
}

(async () => {
  const nc = await connect({ servers: E.NATS_A });
  await local(nc);
  await interop(nc);
  await nc.close();
  await mesh();
  await secure();
  await auth();
  await reconnect();
  console.log(`nats.js: ${passed} checks passed`);
  process.exit(0);
})().catch((e) => {
  console.log("FAIL nats.js:", e);
  process.exit(1);
});
