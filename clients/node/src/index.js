// SPDX-License-Identifier: Apache-2.0
// A client for the airlock relay socket (doc/RELAY.md, protocol 3). No dependencies.
import { createHash } from "node:crypto";
import { EventEmitter } from "node:events";
import { existsSync, realpathSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { basename, join, relative, sep } from "node:path";

export const PROTOCOL = 3;
const LINE_MAX = 1 << 20; // the relay's request line limit (hello.line_max)
const IN_MAX = 8 << 20; // the longest event line we accept

/** An error event from the relay, or a failure of the connection. */
export class RelayError extends Error {
  constructor(code, message, id) {
    super(message ? `${message} (${code})` : code);
    this.name = "RelayError";
    this.code = code;
    this.id = id;
  }
}

/** The relay socket of a workspace, as `airlock up` makes it (doc/RELAY.md "The socket"). */
export function socketPath(workspace, env = process.env) {
  if (env.AIRLOCK_SOCKET) return env.AIRLOCK_SOCKET;
  const real = realpathSync(workspace);
  const name = (basename(real) || "root").replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 32);
  const hash = createHash("sha256").update(real).digest("hex").slice(0, 16);
  const uid = process.getuid();
  let dir;
  if (env.XDG_RUNTIME_DIR) dir = join(env.XDG_RUNTIME_DIR, "airlock");
  else if (existsSync(`/run/user/${uid}`)) dir = `/run/user/${uid}/airlock`;
  else dir = `/tmp/airlock-${uid}`;
  return join(dir, `${name}-${hash}.sock`);
}

/** A path below the workspace as the relay's `cwd` ("" for the root); throws outside it. */
export function relativeCwd(workspace, dir) {
  const rel = relative(realpathSync(workspace), realpathSync(dir));
  if (rel === ".." || rel.startsWith(".." + sep) || rel.startsWith(sep)) {
    throw new RelayError("bad_field", `${dir} is not inside the workspace ${workspace}`);
  }
  return rel.split(sep).join("/");
}

function b64(data) {
  return Buffer.isBuffer(data) ? data.toString("base64") : Buffer.from(String(data), "utf8").toString("base64");
}

function chunkOf(ev) {
  if (typeof ev.data === "string") return Buffer.from(ev.data, "utf8");
  if (typeof ev.data_b64 === "string") return Buffer.from(ev.data_b64, "base64");
  return Buffer.alloc(0);
}

/**
 * One command the relay runs (exec or attach). Events: "started", "stdout" (Buffer, offset),
 * "stderr" (Buffer, offset), "dropped", "exit". `started` and `exit` are also promises.
 */
export class Command extends EventEmitter {
  constructor(client, id) {
    super();
    this.client = client;
    this.id = id;
    this.exitEvent = null;
    this.startEvent = null;
    this.started = new Promise((res, rej) => {
      this._started = res;
      this._startFail = rej;
    });
    this.exit = new Promise((res, rej) => {
      this._exit = res;
      this._exitFail = rej;
    });
    this.started.catch(() => {});
    this.exit.catch(() => {});
  }

  _event(ev) {
    switch (ev.event) {
      case "started":
      case "attached":
        this.startEvent = ev;
        this._started(ev);
        this.emit(ev.event, ev);
        break;
      case "stdout":
      case "stderr":
        this.emit(ev.event, chunkOf(ev), ev.offset);
        break;
      case "dropped":
        this.emit("dropped", ev);
        break;
      case "exit":
      case "result":
        this.exitEvent = ev;
        this._started(ev);
        this._exit(ev);
        this.client._forget(this);
        this.emit("exit", ev);
        break;
      case "error": {
        const err = new RelayError(ev.code, ev.message, ev.id);
        if (this.startEvent && ["busy", "stdin_closed", "not_running"].includes(ev.code)) {
          this.emit("relayError", err); // about a signal or stdin: the command goes on, its exit follows
          break;
        }
        this._startFail(err);
        this._exitFail(err);
        this.client._forget(this);
        this.emit("relayError", err);
        break;
      }
    }
  }

  /** Feed stdin (exec with stdin: true). Resolves once the relay took it; retries while busy. */
  async write(data, { eof = false } = {}) {
    const buf = Buffer.isBuffer(data) ? data : Buffer.from(String(data), "utf8");
    for (let off = 0, delay = 1; ; ) {
      const part = buf.subarray(off, off + 32 * 1024);
      const last = off + part.length >= buf.length;
      const busy = await this.client._stdinFenced(this.id, part, eof && last);
      if (busy) {
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, 50);
        continue;
      }
      delay = 1;
      off += part.length;
      if (last) return;
    }
  }

  /** Close stdin. */
  end() {
    return this.write(Buffer.alloc(0), { eof: true });
  }

  signal(sig) {
    return this.client._request({ op: "signal", id: this.id, signal: sig }, "ok");
  }

  resize(rows, cols) {
    return this.client._request({ op: "resize", id: this.id, rows, cols }, "ok");
  }

  cancel() {
    return this.client._request({ op: "cancel", id: this.id }, "ok");
  }
}

/** A connection to one relay. Use `RelayClient.connect`. */
export class RelayClient extends EventEmitter {
  constructor(sock, hello) {
    super();
    this.sock = sock;
    this.hello = hello;
    this.commands = new Map(); // id -> Command, for output and exit events
    this.pending = new Map(); // request id -> {want, res, rej}
    this.seq = 0;
    this.closed = false;
  }

  /**
   * Connect to a relay: `{ socket }`, or `{ workspace }` (its default socket), else
   * $AIRLOCK_SOCKET. Resolves after the relay's hello (protocol checked).
   */
  static connect(opts = {}) {
    const path = opts.socket || (opts.workspace ? socketPath(opts.workspace) : process.env.AIRLOCK_SOCKET);
    if (!path) return Promise.reject(new RelayError("no_socket", "no relay socket: pass socket or workspace"));
    return new Promise((resolve, reject) => {
      const sock = netConnect(path);
      let client = null;
      let buf = Buffer.alloc(0);
      const fail = (err) => {
        if (client) client._closed(err);
        else reject(err);
      };
      sock.on("error", (e) =>
        fail(new RelayError("unreachable", `cannot reach the relay at ${path}: ${e.message} (is 'airlock up' running?)`)),
      );
      sock.on("close", () => fail(new RelayError("closed", "the relay closed the connection")));
      sock.on("data", (d) => {
        buf = buf.length ? Buffer.concat([buf, d]) : d;
        let nl;
        while ((nl = buf.indexOf(10)) >= 0) {
          const line = buf.subarray(0, nl).toString("utf8");
          buf = buf.subarray(nl + 1);
          if (!line.trim()) continue;
          let ev;
          try {
            ev = JSON.parse(line);
          } catch {
            fail(new RelayError("bad_json", "the relay sent a line that is not JSON"));
            sock.destroy();
            return;
          }
          if (!client) {
            if (ev.event === "error") {
              reject(new RelayError(ev.code, ev.message));
              sock.destroy();
              return;
            }
            if (ev.event !== "hello" || ev.protocol !== PROTOCOL) {
              reject(new RelayError("protocol", `expected hello with protocol ${PROTOCOL}, got ${line.slice(0, 200)}`));
              sock.destroy();
              return;
            }
            client = new RelayClient(sock, ev);
            resolve(client);
            continue;
          }
          client._dispatch(ev);
        }
        if (buf.length > IN_MAX) {
          fail(new RelayError("line_too_long", "the relay sent a line over 8 MiB"));
          sock.destroy();
        }
      });
    });
  }

  _nextId(prefix) {
    return `${prefix}-${process.pid}-${++this.seq}`;
  }

  _send(obj) {
    if (this.closed) throw new RelayError("closed", "the connection is closed");
    const line = JSON.stringify(obj);
    if (Buffer.byteLength(line) > (this.hello.line_max || LINE_MAX)) {
      throw new RelayError("line_too_long", `request over the relay's ${this.hello.line_max} byte line limit`);
    }
    this.sock.write(line + "\n");
  }

  /** Send a request with a fresh id (unless given) and resolve with the event named `want`. */
  _request(req, want) {
    const id = req.id ?? this._nextId(req.op);
    const key = `${want}\u0000${JSON.stringify(id)}`;
    return new Promise((res, rej) => {
      this.pending.set(key, { res, rej });
      try {
        this._send({ ...req, id });
      } catch (e) {
        this.pending.delete(key);
        rej(e);
      }
    });
  }

  async _stdinFenced(id, part, eof) {
    const fence = this._nextId("fence");
    let busy = false;
    const errKey = `stdinerr\u0000${JSON.stringify(id)}`;
    this.pending.set(errKey, { res: () => {}, rej: (e) => (busy = e.code === "busy" ? true : e) });
    this._send({ op: "stdin", id, data_b64: b64(part), eof });
    await this._request({ op: "status", id: fence }, "status");
    this.pending.delete(errKey);
    if (busy instanceof Error) throw busy;
    return busy;
  }

  _dispatch(ev) {
    const id = ev.id;
    const jid = JSON.stringify(id);
    if (ev.event === "error" && id !== undefined) {
      const se = this.pending.get(`stdinerr\u0000${jid}`);
      if (se && (ev.code === "busy" || ev.code === "stdin_closed" || ev.code === "not_running")) return se.rej(new RelayError(ev.code, ev.message, id));
      for (const [key, p] of this.pending) {
        if (key.endsWith(`\u0000${jid}`)) {
          this.pending.delete(key);
          return p.rej(new RelayError(ev.code, ev.message, id));
        }
      }
    }
    const p = this.pending.get(`${ev.event}\u0000${jid}`);
    if (p) {
      this.pending.delete(`${ev.event}\u0000${jid}`);
      return p.res(ev);
    }
    const cmd = id !== undefined ? this.commands.get(jid) : undefined;
    if (cmd) return cmd._event(ev);
    this.emit("event", ev);
  }

  _forget(cmd) {
    this.commands.delete(JSON.stringify(cmd.id));
  }

  _closed(err) {
    if (this.closed) return;
    this.closed = true;
    for (const p of this.pending.values()) p.rej(err);
    this.pending.clear();
    for (const c of this.commands.values()) c._event({ event: "error", id: c.id, code: err.code, message: err.message });
    this.commands.clear();
    this.emit("close", err);
  }

  _track(id) {
    const jid = JSON.stringify(id);
    if (this.commands.has(jid)) throw new RelayError("duplicate_id", `a command ${jid} is already tracked here`);
    const cmd = new Command(this, id);
    this.commands.set(jid, cmd);
    return cmd;
  }

  /**
   * Run a command: `{ argv }` or `{ shell }`, and `cwd`, `env`, `timeoutSeconds`, `tty`, `stdin`
   * (doc/RELAY.md exec). Returns the Command at once; its output streams as events.
   */
  exec(spec) {
    const id = spec.id ?? this._nextId("exec");
    const cmd = this._track(id);
    const req = { op: "exec", id, encoding: "base64" };
    if (spec.argv) req.argv = spec.argv;
    if (spec.shell !== undefined) req.shell = spec.shell;
    if (spec.cwd) req.cwd = spec.cwd;
    if (spec.env) req.env = spec.env;
    if (spec.timeoutSeconds) req.timeout_seconds = spec.timeoutSeconds;
    if (spec.tty) req.tty = spec.tty;
    if (spec.stdin) req.stdin = true;
    if (spec.tail) req.tail = spec.tail;
    try {
      this._send(req);
    } catch (e) {
      this._forget(cmd);
      throw e;
    }
    return cmd;
  }

  /** Run a command and resolve with the tails of its output (the relay's tail mode). */
  async execTail(spec, tail = { stdout_bytes: 8000, stderr_bytes: 4000 }) {
    const r = await this.exec({ ...spec, tail }).exit;
    const text = (t, b) => (typeof t === "string" ? t : Buffer.from(b || "", "base64").toString("utf8"));
    return { ...r, stdout: text(r.stdout, r.stdout_b64), stderr: text(r.stderr, r.stderr_b64) };
  }

  /** Re-attach to a command (from another connection, after a reload): `from` a byte offset or {stdout, stderr}. */
  attach(id, { from } = {}) {
    const cmd = this._track(id);
    const req = { op: "attach", id, encoding: "base64" };
    if (from !== undefined) req.from = from;
    this._send(req);
    return cmd;
  }

  /** Running and recently finished commands. */
  async status() {
    return (await this._request({ op: "status" }, "status")).commands;
  }

  /** Resolves once every change saved before the call is in the guest. */
  async syncWait() {
    await this._request({ op: "sync_wait" }, "synced");
  }

  /** What commands changed in the guest: `{ paths, diff }` (doc/RELAY.md "Changes"). */
  async changes({ paths, diff } = {}) {
    const req = { op: "changes" };
    if (paths) req.paths = paths;
    if (diff) req.diff = true;
    return this._request(req, "changes");
  }

  /** Write guest changes to the host: an array of paths, or "all". */
  accept(paths) {
    return this._request({ op: "accept", ...(paths === "all" ? { all: true } : { paths }) }, "accepted");
  }

  /** Put the host's versions back in the guest: an array of paths, or "all". */
  reject(paths) {
    return this._request({ op: "reject", ...(paths === "all" ? { all: true } : { paths }) }, "rejected");
  }

  close() {
    if (!this.closed) this.sock.destroy(); // not end(): the relay may keep its side open while commands run
    this._closed(new RelayError("closed", "closed by the client"));
  }
}
