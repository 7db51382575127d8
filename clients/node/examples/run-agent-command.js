// SPDX-License-Identifier: Apache-2.0
// What an editor extension calls INSTEAD of spawning a local shell for a command its agent proposed:
// the command runs in the airlock sandbox of the workspace (never on this machine), in the same
// directory of the guest's copy, and comes back as { exitCode, stdout, stderr } with the tails of
// the output (8000 and 4000 bytes). No fallback to the host: without `airlock up` it throws.
import { RelayClient, relativeCwd } from "../src/index.js";

const clients = new Map(); // workspace -> Promise<RelayClient>, one connection per workspace

function clientFor(workspace) {
  let c = clients.get(workspace);
  if (!c) {
    c = RelayClient.connect({ workspace });
    c.then((client) => client.on("close", () => clients.delete(workspace)), () => clients.delete(workspace));
    clients.set(workspace, c);
  }
  return c;
}

export async function runAgentCommand(workspace, command, { cwd = workspace, timeoutSeconds = 300 } = {}) {
  const client = await clientFor(workspace);
  const r = await client.execTail({ shell: command, cwd: relativeCwd(workspace, cwd), timeoutSeconds });
  return {
    exitCode: r.code ?? 128 + (r.signal ?? 0),
    timedOut: r.timed_out,
    stdout: r.stdout,
    stderr: r.stderr,
  };
}

// The extension deactivating.
export async function teardown() {
  for (const [ws, c] of clients) {
    clients.delete(ws);
    (await c.catch(() => null))?.close();
  }
}

// node examples/run-agent-command.js WORKSPACE COMMAND
if (import.meta.url === `file://${process.argv[1]}`) {
  const [ws, cmd] = process.argv.slice(2);
  const r = await runAgentCommand(ws, cmd);
  process.stdout.write(r.stdout);
  process.stderr.write(r.stderr);
  await teardown();
  process.exit(r.exitCode);
}
