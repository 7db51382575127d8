// SPDX-License-Identifier: Apache-2.0
// Types of airlock-relay-client (doc/RELAY.md, protocol 3).
import { EventEmitter } from "node:events";

export declare const PROTOCOL: 3;

export declare class RelayError extends Error {
  /** The relay's stable error code (doc/RELAY.md), or: no_socket, unreachable, closed, protocol, bad_json, line_too_long, duplicate_id. */
  code: string;
  id?: string | number;
}

export interface Hello { event: "hello"; protocol: 3; server: string; line_max: number; ring_bytes: number; }
export interface Started { event: "started"; id: string | number; pid: number; where: "guest" | "host"; }
export interface Attached { event: "attached"; id: string | number; state: string; pid: number; stdout_offset: number; stderr_offset: number; }
export interface Exit {
  event: "exit"; id: string | number; code: number | null; signal: number | null; timed_out: boolean;
  duration_ms: number; stdout_bytes: number; stderr_bytes: number; truncated: boolean;
  changes?: { written_back: number; waiting: number };
}
export interface TailResult {
  event: "result"; id: string | number; code: number | null; signal: number | null; timed_out: boolean;
  duration_ms: number; stdout_bytes: number; stderr_bytes: number;
  stdout: string; stdout_truncated: boolean; stderr: string; stderr_truncated: boolean;
}
export interface CommandStatus {
  id: string | number; argv: string[]; shell: boolean; state: "starting" | "running" | "exited" | "failed";
  pid: number; where: "guest" | "host"; started_ms: number; stdout_bytes: number; stderr_bytes: number;
  attached: number; paused: boolean; code?: number | null; signal?: number | null; timed_out?: boolean;
  duration_ms?: number; error?: string;
}
export interface Change {
  path: string; kind: "create" | "modify" | "delete" | "rename" | "mode" | "symlink"; size: number; mode: string;
  protected: string | null; conflict: boolean; by: { id: string | number; argv: string[] } | null;
  from?: string; target?: string; host_size?: number;
}
export interface Changes { event: "changes"; version: 1; changes: Change[]; guest?: Record<string, { text: string } | { binary: true }>; }
export interface Accepted { event: "accepted"; accepted: string[]; refused: { path: string; why: string; protected?: string }[]; error?: string; }
export interface Rejected { event: "rejected"; rejected: string[]; refused: { path: string; why: string }[]; }

export interface ExecSpec {
  id?: string | number;
  /** An argv, run without a shell, or `shell`: one string run with sh -c. */
  argv?: string[];
  shell?: string;
  /** Relative to the workspace root ("" = the root); see relativeCwd. */
  cwd?: string;
  env?: Record<string, string>;
  timeoutSeconds?: number;
  tty?: boolean | { rows: number; cols: number };
  /** Feed stdin with Command.write / end. */
  stdin?: boolean;
}

export declare class Command extends EventEmitter {
  readonly id: string | number;
  /** Resolves with started (exec) or attached (attach); rejects with a RelayError when it could not run. */
  readonly started: Promise<Started | Attached>;
  /** Resolves with the exit event (result in tail mode). */
  readonly exit: Promise<Exit>;
  on(event: "stdout" | "stderr", fn: (chunk: Buffer, offset: number) => void): this;
  on(event: "exit", fn: (ev: Exit) => void): this;
  on(event: "dropped", fn: (ev: { stream: string; offset: number; bytes: number }) => void): this;
  on(event: "relayError", fn: (err: RelayError) => void): this;
  write(data: string | Buffer, opts?: { eof?: boolean }): Promise<void>;
  end(): Promise<void>;
  signal(sig: string | number): Promise<unknown>;
  resize(rows: number, cols: number): Promise<unknown>;
  cancel(): Promise<unknown>;
}

export declare class RelayClient extends EventEmitter {
  readonly hello: Hello;
  static connect(opts?: { socket?: string; workspace?: string }): Promise<RelayClient>;
  exec(spec: ExecSpec): Command;
  execTail(spec: ExecSpec, tail?: { stdout_bytes: number; stderr_bytes: number }): Promise<TailResult>;
  attach(id: string | number, opts?: { from?: number | { stdout: number; stderr: number } }): Command;
  status(): Promise<CommandStatus[]>;
  syncWait(): Promise<void>;
  changes(opts?: { paths?: string[]; diff?: boolean }): Promise<Changes>;
  accept(paths: string[] | "all"): Promise<Accepted>;
  reject(paths: string[] | "all"): Promise<Rejected>;
  close(): void;
}

/** The relay socket of a workspace: $AIRLOCK_SOCKET, else the path airlock up makes. */
export declare function socketPath(workspace: string, env?: NodeJS.ProcessEnv): string;
/** dir as a cwd relative to the workspace root; throws a RelayError outside it. */
export declare function relativeCwd(workspace: string, dir: string): string;
