import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { JsonRpcMessage, McpPostBody, TeamMcpParams } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf } from '../../services/principal.ts';
import { checkTeamCaller, TEAM_MCP_SERVER, TEAM_WAIT_MAX_S, teamMcpServer } from '../../services/team-mcp.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['team'];
const PATH = '/api/mcp/team/:conversation_id';

const AUTH = `Authenticated by the sandbox token of that conversation only (\`Authorization: Bearer $SVC_SANDBOX_TOKEN\`): another conversation's token is 404, a person's API key or session 403 \`forbidden\`, none 401. The conversation must be on the team channel (\`svc:team\`), else 404.`;

/**
 * The team MCP server `svc-team` (SPEC Team rule 7) over MCP's Streamable HTTP transport, in
 * its stateless form: every POST carries whole JSON-RPC exchanges and gets its answer as JSON;
 * there is no session and no server-initiated stream, so GET and DELETE are not routes: they
 * answer 405 (Allow: POST), as MCP's stateless servers answer them, which MCP clients expect.
 */
export function teamMcpRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const, sprite: true };

  r.post(PATH, {
    config,
    schema: {
      tags,
      summary: `The team MCP server (${TEAM_MCP_SERVER}): MCP over Streamable HTTP`,
      operationId: 'callTeamMcp',
      description: `Each conversation on the team channel gets this server in its runtime's MCP configuration (named \`${TEAM_MCP_SERVER}\`, with its token in an Authorization header; a runtime without HTTP MCP gets it through a stdio bridge of the runner). Tools: \`list_teammates\`, \`get_teammate\` (by name, role or keyword), \`send_to_teammate\` (the message lands in the target's thread as a turn, the sender named in front; a busy, starting or machine-off target is a tool error), \`wait_for_teammate\` (blocks up to ${TEAM_WAIT_MAX_S} s for that turn to end; \`timed_out: true\` means call again), \`read_teammate\` (recent prompts and replies). Tool failures are results with \`isError: true\`, not HTTP errors. Stateless: no \`Mcp-Session-Id\`; the client must accept \`application/json\` and \`text/event-stream\` (406 otherwise) and answers come as JSON. ${AUTH}`,
      params: TeamMcpParams,
      body: McpPostBody,
      errors: ['not_found'],
      response: {
        200: z.union([JsonRpcMessage, z.array(JsonRpcMessage)]).meta({
          description: 'The JSON-RPC response(s) to the request(s) in the body.',
        }),
        202: z.null().meta({ description: 'Accepted: the body held only notifications or responses.' }),
      },
    },
    handler: async (req, reply) => {
      const who = requirePrincipal(req);
      const conversationId = req.params.conversation_id;
      await checkTeamCaller(deps.sql, who, conversationId);
      const server = teamMcpServer(deps.teamMcp, actorOf(who), conversationId);
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      // The transport writes the answer itself; a tool call may hold it (wait_for_teammate).
      reply.hijack();
      reply.raw.on('close', () => {
        void transport.close();
        void server.close();
      });
      await server.connect(transport);
      await transport.handleRequest(req.raw, reply.raw, req.body);
    },
  });
}
