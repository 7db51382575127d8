// SPDX-License-Identifier: Apache-2.0
// Against a real `airlock up` (tests/e2e/agent_client_node.sh starts it): AIRLOCK_SOCKET, and
// AIRLOCK_TEST_W, the workspace mount. Run: node --test test/
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { RelayClient, RelayError, relativeCwd, socketPath } from "../src/index.js";
import { runAgentCommand, teardown } from "../examples/run-agent-command.js";

const W = process.env.AIRLOCK_TEST_W;
if (!W || !process.env.AIRLOCK_SOCKET) throw new Error("run from tests/e2e/agent_client_node.sh (AIRLOCK_TEST_W, AIRLOCK_SOCKET)");

// A connection closed when the test ends, passed or not (an open one keeps node --test waiting).
async function client(t, opts) {
  const c = await RelayClient.connect(opts);
  t.after(() => c.close());
  return c;
}

function collect(cmd) {
  const out = { stdout: [], stderr: [] };
  cmd.on("stdout", (b) => out.stdout.push(b));
  cmd.on("stderr", (b) => out.stderr.push(b));
  return () => ({ stdout: Buffer.concat(out.stdout).toString(), stderr: Buffer.concat(out.stderr).toString() });
}

test("hello, and the socket path airlock up uses", async (t) => {
  const c = await client(t);
  assert.equal(c.hello.protocol, 3);
  assert.equal(socketPath(W), process.env.AIRLOCK_SOCKET);
  const other = { ...process.env };
  delete other.AIRLOCK_SOCKET;
  assert.match(socketPath(W, other), /\/[A-Za-z0-9._-]+-[0-9a-f]{16}\.sock$/);
});

test("exec: streaming stdout and stderr, the exit code, where it ran", async (t) => {
  const c = await client(t, { socket: process.env.AIRLOCK_SOCKET });
  const cmd = c.exec({ argv: ["sh", "-c", 'echo out; echo err >&2; test -e .env || echo no-env; exit 3'] });
  const got = collect(cmd);
  const st = await cmd.started;
  assert.equal(st.where, "guest");
  const ex = await cmd.exit;
  assert.equal(ex.code, 3);
  assert.deepEqual(got(), { stdout: "out\nno-env\n", stderr: "err\n" });
});

test("exec: shell, cwd below the root, env; a bad cwd is the relay's bad_field", async (t) => {
  const c = await client(t);
  const cmd = c.exec({ shell: 'echo "$X $(basename "$PWD")"', cwd: relativeCwd(W, join(W, "sub")), env: { X: "hi" } });
  const got = collect(cmd);
  assert.equal((await cmd.exit).code, 0);
  assert.equal(got().stdout, "hi sub\n");
  await assert.rejects(c.exec({ argv: ["true"], cwd: "../x" }).exit, (e) => e instanceof RelayError && e.code === "bad_field");
  assert.throws(() => relativeCwd(W, "/"), RelayError);
});

test("stdin: 200 KiB through write and end comes back whole", async (t) => {
  const c = await client(t);
  const cmd = c.exec({ argv: ["sh", "-c", "wc -c; cat >/dev/null"], stdin: true });
  const got = collect(cmd);
  await cmd.started;
  await cmd.write(Buffer.alloc(200 * 1024, 97));
  await cmd.end();
  assert.equal((await cmd.exit).code, 0);
  assert.equal(got().stdout.trim(), String(200 * 1024));
});

test("tails: execTail keeps the last bytes and says so", async (t) => {
  const c = await client(t);
  const r = await c.execTail({ shell: "seq 1 100000; echo tail-err >&2; exit 4" });
  assert.equal(r.code, 4);
  assert.equal(r.stdout.length, 8000);
  assert.ok(r.stdout.endsWith("99999\n100000\n"));
  assert.equal(r.stdout_truncated, true);
  assert.equal(r.stderr, "tail-err\n");
});

test("attach from another connection, status, cancel", async (t) => {
  const a = await client(t);
  const cmd = a.exec({ id: `attach-${process.pid}`, shell: "echo first; sleep 30; echo never" });
  const first = new Promise((r) => cmd.once("stdout", r));
  await cmd.started;
  await first;
  a.close(); // the command outlives the connection
  const b = await client(t);
  const st = await b.status();
  const mine = st.find((s) => s.id === `attach-${process.pid}`);
  assert.equal(mine?.state, "running", JSON.stringify(st));
  const again = b.attach(`attach-${process.pid}`, { from: 0 });
  const got = collect(again);
  const att = await again.started;
  assert.equal(att.event, "attached");
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(got().stdout, "first\n"); // replayed from offset 0
  await again.cancel();
  const ex = await again.exit;
  assert.notEqual(ex.signal, null);
  assert.ok(!got().stdout.includes("never"));
});

test("sync_wait: a file saved on the host is there for the next command", async (t) => {
  const c = await client(t);
  writeFileSync(join(W, "saved.txt"), "saved on the host\n");
  await c.syncWait();
  const r = await c.execTail({ argv: ["cat", "saved.txt"] });
  assert.equal(r.stdout, "saved on the host\n");
});

test("changes, accept, reject: a command's files wait for review, then land or go", async (t) => {
  const c = await client(t);
  const r = await c.execTail({ shell: "echo made > made.txt; echo gone > gone.txt" });
  assert.equal(r.code, 0);
  const ch = await c.changes({ diff: true });
  const paths = ch.changes.map((x) => x.path).sort();
  assert.deepEqual(paths, ["gone.txt", "made.txt"]);
  assert.equal(ch.changes[0].kind, "create");
  assert.equal(ch.guest["made.txt"].text, "made\n");
  assert.equal(existsSync(join(W, "made.txt")), false);
  const acc = await c.accept(["made.txt"]);
  assert.deepEqual(acc.accepted, ["made.txt"]);
  assert.equal(readFileSync(join(W, "made.txt"), "utf8"), "made\n");
  const rej = await c.reject(["gone.txt"]);
  assert.deepEqual(rej.rejected, ["gone.txt"]);
  assert.deepEqual((await c.changes()).changes, []);
});

test("runAgentCommand (examples/): replaces a local spawn, in the guest, from a subdirectory", async () => {
  const r = await runAgentCommand(W, 'printf "%s\\n" "$(basename "$PWD")" "it\'s"; test -e ../.env || echo no-env; exit 5', {
    cwd: join(W, "sub"),
  });
  assert.deepEqual(r, { exitCode: 5, timedOut: false, stdout: "sub\nit's\nno-env\n", stderr: "" });
  const t = await runAgentCommand(W, "sleep 5", { timeoutSeconds: 0.5 });
  assert.equal(t.timedOut, true);
  await teardown();
});

test("no relay: a clear error, no fallback", async () => {
  await assert.rejects(RelayClient.connect({ socket: "/nonexistent/airlock.sock" }), (e) => e.code === "unreachable" && /airlock up/.test(e.message));
});
