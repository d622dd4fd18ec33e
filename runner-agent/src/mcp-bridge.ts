import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { MCP_BRIDGE_COMMAND, type McpServerEntry } from '@svc/core';

/*
 * MCP for runtimes that take only stdio servers: an HTTP MCP server of a turn (the service's
 * `svc-team`) is given to such a runtime as a stdio server that is this runner's own
 * executable, `svc-runner mcp-bridge <url>`, relaying each JSON-RPC message between its stdio
 * and the URL (MCP's Streamable HTTP, through the SDK's transports on both sides). The
 * headers (the sandbox token) travel in the bridge's environment, never its command line.
 */

/** The variable holding the HTTP headers of the bridged server, as a JSON list of `{name, value}`. */
const HEADERS_ENV = 'SVC_MCP_HEADERS';

type AcpMcpServer =
  | { name: string; command: string; args: string[]; env: { name: string; value: string }[] }
  | { type: 'http'; name: string; url: string; headers: { name: string; value: string }[] };

/**
 * A turn's MCP servers as ACP `session/new` takes them: stdio entries with `env` empty (they
 * inherit the runtime's); HTTP entries as they are when the runtime takes HTTP servers
 * (`mcpCapabilities.http`), else as a stdio bridge run by `node` with this process's entry
 * script (the runner's own executable, built or from source).
 */
export function acpMcpServers(entries: McpServerEntry[], httpCapable: boolean): AcpMcpServer[] {
  return entries.map((m) => {
    if (!('type' in m)) return { ...m, env: [] };
    if (httpCapable) return m;
    return {
      name: m.name,
      command: process.execPath,
      args: [process.argv[1] ?? '', MCP_BRIDGE_COMMAND, m.url],
      env: [{ name: HEADERS_ENV, value: JSON.stringify(m.headers) }],
    };
  });
}

/**
 * Runs the bridge until its stdin closes, then exits. A request the URL cannot answer gets a
 * JSON-RPC error naming why, so the runtime's call fails instead of hanging.
 */
export async function runMcpBridge(args: string[]): Promise<never> {
  const url = args[0];
  if (!url) {
    process.stderr.write(`usage: svc-runner ${MCP_BRIDGE_COMMAND} <MCP server URL>  (headers in ${HEADERS_ENV})\n`);
    process.exit(2);
  }
  const headers: Record<string, string> = {};
  for (const h of JSON.parse(process.env[HEADERS_ENV] ?? '[]') as { name: string; value: string }[]) {
    headers[h.name] = h.value;
  }
  const local = new StdioServerTransport();
  const remote = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  local.onmessage = (message: JSONRPCMessage) => {
    remote.send(message).catch((err: Error) => {
      if ('method' in message && 'id' in message) {
        void local.send({
          jsonrpc: '2.0',
          id: message.id,
          error: { code: -32603, message: `${url} did not answer: ${err.message}` },
        });
      }
    });
  };
  remote.onmessage = (message) => void local.send(message);
  remote.onerror = (err) => process.stderr.write(`svc-runner ${MCP_BRIDGE_COMMAND}: ${err.message}\n`);
  local.onclose = () => process.exit(0);
  process.stdin.on('end', () => process.exit(0));
  await remote.start();
  await local.start();
  return new Promise<never>(() => {});
}
