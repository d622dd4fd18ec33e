/**
 * A local stand-in for the Gemini API (`generativelanguage.googleapis.com`) as Gemini CLI uses
 * it, speaking its wire format: `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`
 * answered as a server-sent event stream of `GenerateContentResponse` chunks (`candidates`
 * with `content.parts`: text split over several chunks, each thought whole in a part marked
 * `thought: true`, the last chunk carrying `finishReason: "STOP"` and `usageMetadata`);
 * `POST .../{model}:generateContent` as one such response; `POST .../{model}:countTokens`;
 * `GET /v1beta/models`; and the API's own error bodies (401 `UNAUTHENTICATED` for a wrong
 * `x-goog-api-key`, 404 `NOT_FOUND` for any other route).
 *
 * What each call answers is the test's `reply(request)`; every request is recorded, so a test
 * can check what the agent sent (the model in the path, the system instruction, the headers).
 */
import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { type ApiRequest, pieces, startModelApi } from './model-api.ts';

export interface Reply {
  parts: ({ text: string } | { thought: string })[];
}

/** The parts of a generateContent request body the tests look at. */
export interface GenerateBody {
  contents?: { role?: string; parts?: { text?: string }[] }[];
  systemInstruction?: { role?: string; parts?: { text?: string }[] } | string;
  tools?: unknown[];
}

/** One request the fake received. `model` and `call` (the method) come from its path. */
export interface SeenRequest extends ApiRequest<GenerateBody> {
  model: string | null;
  call: string | null;
}

export interface FakeGemini {
  url: string;
  seen: SeenRequest[];
  /** The streamGenerateContent requests, in arrival order. */
  streams(): SeenRequest[];
  close(): Promise<void>;
}

const tokensOf = (text: string) => Math.ceil(text.length / 4);

/** The text of a body's system instruction. */
export function systemText(body: GenerateBody | null | undefined): string {
  const s = body?.systemInstruction;
  if (typeof s === 'string') return s;
  return (s?.parts ?? []).map((p) => p.text ?? '').join('');
}

/** The text of a body's contents of `role` (all roles when absent). */
export function contentText(body: GenerateBody | null | undefined, role?: string): string {
  return (body?.contents ?? [])
    .filter((c) => role === undefined || c.role === role)
    .flatMap((c) => c.parts ?? [])
    .map((p) => p.text ?? '')
    .join('\n');
}

function send(res: ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { 'content-type': 'application/json; charset=UTF-8' });
  res.end(JSON.stringify(body));
}

const error = (code: number, status: string, message: string) => ({ error: { code, message, status } });

export async function startFakeGemini(options: {
  /** The one `x-goog-api-key` accepted. */
  apiKey: string;
  /** What `GET /v1beta/models` lists (the service pings it to validate a credential). */
  models?: string[];
  reply(request: GenerateBody, model: string): Reply;
}): Promise<FakeGemini> {
  const seen: SeenRequest[] = [];
  const server = await startModelApi<GenerateBody>((req, res) => {
    const { path, body } = req;
    const m = /^\/v1beta\/models\/([^/:]+):(\w+)$/.exec(path);
    const model = m?.[1] ?? null;
    const call = m?.[2] ?? null;
    seen.push({ ...req, model, call });
    const known =
      (req.method === 'GET' && path === '/v1beta/models') ||
      (req.method === 'POST' && ['streamGenerateContent', 'generateContent', 'countTokens'].includes(call ?? ''));
    if (!known) return send(res, 404, error(404, 'NOT_FOUND', `${req.method} ${path} not found`));
    if (req.headers['x-goog-api-key'] !== options.apiKey) {
      return send(res, 401, error(401, 'UNAUTHENTICATED', 'API key not valid. Please pass a valid API key.'));
    }
    if (path === '/v1beta/models') {
      return send(res, 200, {
        models: (options.models ?? []).map((id) => ({
          name: `models/${id}`,
          displayName: id,
          supportedGenerationMethods: ['generateContent', 'countTokens'],
        })),
      });
    }
    if (call === 'countTokens') {
      return send(res, 200, { totalTokens: tokensOf(JSON.stringify(body ?? {})) });
    }
    const reply = options.reply(body ?? {}, model ?? '');
    const parts = reply.parts.map((p) => ('thought' in p ? { text: p.thought, thought: true } : { text: p.text }));
    const usageMetadata = {
      promptTokenCount: tokensOf(JSON.stringify(body?.contents ?? []) + systemText(body)),
      candidatesTokenCount: tokensOf(JSON.stringify(parts)),
      totalTokenCount: 0,
    };
    usageMetadata.totalTokenCount = usageMetadata.promptTokenCount + usageMetadata.candidatesTokenCount;
    const responseId = randomBytes(9).toString('base64url');
    if (call === 'generateContent') {
      return send(res, 200, {
        candidates: [{ content: { parts, role: 'model' }, finishReason: 'STOP', index: 0 }],
        usageMetadata,
        modelVersion: model,
        responseId,
      });
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const chunk = (data: object) =>
      res.write(`data: ${JSON.stringify({ ...data, modelVersion: model, responseId })}\r\n\r\n`);
    // Text comes in pieces; a thought comes whole, as the API sends a thought summary.
    const streamed = parts.flatMap((p) => ('thought' in p ? [p] : pieces(p.text, 8).map((text) => ({ text }))));
    streamed.forEach((part, i) => {
      const last = i === streamed.length - 1;
      chunk({
        candidates: [
          { content: { parts: [part], role: 'model' }, index: 0, ...(last ? { finishReason: 'STOP' } : {}) },
        ],
        ...(last ? { usageMetadata } : {}),
      });
    });
    res.end();
  });
  return {
    ...server,
    seen,
    streams: () => seen.filter((r) => r.call === 'streamGenerateContent'),
  };
}
