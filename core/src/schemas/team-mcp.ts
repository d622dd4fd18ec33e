import { z } from 'zod';

/** The path parameter of the team MCP server: the calling teammate's conversation. */
export const TeamMcpParams = z.object({ conversation_id: z.string().min(1).max(100) });

/**
 * One JSON-RPC 2.0 message of MCP (a request, a notification or a response). The MCP SDK
 * checks the rest; the route only refuses what is not JSON-RPC at all.
 */
export const JsonRpcMessage = z
  .object({ jsonrpc: z.literal('2.0') })
  .catchall(z.unknown())
  .meta({ id: 'JsonRpcMessage', description: 'A JSON-RPC 2.0 message of the Model Context Protocol.' });

/** What an MCP client POSTs: one message, or a batch. */
export const McpPostBody = z.union([JsonRpcMessage, z.array(JsonRpcMessage).min(1).max(100)]);
