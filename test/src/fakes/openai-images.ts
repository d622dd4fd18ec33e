/**
 * A local stand-in for OpenAI's Images API (`POST /v1/images/generations`), speaking its wire
 * format: bearer key, JSON request `{model, prompt, n, size}`, answer `{created, data:
 * [{b64_json}]}`, and OpenAI's error body for a bad key. A key starting `good` is accepted.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PNG } from '../../fixtures/images.ts';

export interface FakeImages {
  url: string;
  requests: { model: string; prompt: string; size: string }[];
  close(): Promise<void>;
}

export async function startFakeImages(): Promise<FakeImages> {
  const requests: FakeImages['requests'] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d) => {
      body += d;
    });
    req.on('end', () => {
      const key = (req.headers.authorization ?? '').replace(/^Bearer /, '');
      res.setHeader('content-type', 'application/json');
      if (req.method !== 'POST' || req.url !== '/v1/images/generations') {
        res.statusCode = 404;
        return res.end(JSON.stringify({ error: { message: 'Not found', type: 'invalid_request_error' } }));
      }
      if (!key.startsWith('good')) {
        res.statusCode = 401;
        return res.end(
          JSON.stringify({
            error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', code: 'invalid_api_key' },
          }),
        );
      }
      requests.push(JSON.parse(body));
      res.end(JSON.stringify({ created: Math.floor(Date.now() / 1000), data: [{ b64_json: PNG.toString('base64') }] }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
