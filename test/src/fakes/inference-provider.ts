/**
 * A local stand-in for the inference providers' model-listing endpoints, speaking their wire
 * formats: Anthropic `GET /v1/models` (x-api-key or OAuth bearer, `anthropic-version`),
 * OpenAI `GET /v1/models` (bearer), Gemini `GET /v1beta/models` (x-goog-api-key). A key
 * starting `good` is accepted; `slow` never answers; `boom` gets a 500; anything else the
 * provider's own 401 body.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeProvider {
  url: string;
  /** Every request seen: path and the credential header names (never their values). */
  seen: { path: string; headerNames: string[] }[];
  close(): Promise<void>;
}

function credentialOf(req: IncomingMessage): string | undefined {
  const auth = req.headers.authorization;
  if (auth?.startsWith('Bearer ')) return auth.slice(7);
  return (req.headers['x-api-key'] ?? req.headers['x-goog-api-key']) as string | undefined;
}

function json(res: ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

export async function startFakeProvider(): Promise<FakeProvider> {
  const seen: FakeProvider['seen'] = [];
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0] as string;
    seen.push({ path, headerNames: Object.keys(req.headers).filter((h) => /key|authorization|anthropic/.test(h)) });
    const key = credentialOf(req) ?? '';
    if (key.startsWith('slow')) return; // never answers
    if (key.startsWith('boom'))
      return json(res, 500, { error: { type: 'api_error', message: 'Internal server error' } });
    const good = key.startsWith('good');
    if (path === '/v1/models' && req.headers['anthropic-version']) {
      if (!good)
        return json(res, 401, { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } });
      return json(res, 200, {
        data: [
          {
            type: 'model',
            id: 'claude-sonnet-4-5',
            display_name: 'Claude Sonnet 4.5',
            created_at: '2025-09-29T00:00:00Z',
          },
        ],
        has_more: false,
        first_id: 'claude-sonnet-4-5',
        last_id: 'claude-sonnet-4-5',
      });
    }
    if (path === '/v1/models') {
      if (!good) {
        return json(res, 401, {
          error: {
            message: 'Incorrect API key provided.',
            type: 'invalid_request_error',
            param: null,
            code: 'invalid_api_key',
          },
        });
      }
      return json(res, 200, {
        object: 'list',
        data: [{ id: 'gpt-5', object: 'model', created: 1, owned_by: 'openai' }],
      });
    }
    if (path === '/v1beta/models') {
      if (!good) {
        return json(res, 400, {
          error: { code: 400, message: 'API key not valid. Please pass a valid API key.', status: 'INVALID_ARGUMENT' },
        });
      }
      return json(res, 200, { models: [{ name: 'models/gemini-2.5-pro', displayName: 'Gemini 2.5 Pro' }] });
    }
    json(res, 404, { error: 'not found' });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
