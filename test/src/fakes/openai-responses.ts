/**
 * A local stand-in for the OpenAI API as the Codex and opencode agents use it, speaking its
 * wire format: `POST /v1/responses` answered as a server-sent event stream when the body says
 * `"stream": true` (`response.created`, `response.in_progress`, `response.output_item.added`,
 * `response.content_part.added`, `response.output_text.delta`, `response.output_text.done`,
 * `response.content_part.done`, reasoning summaries as `response.reasoning_summary_part.added`
 * / `response.reasoning_summary_text.delta`, function calls as
 * `response.function_call_arguments.delta`, `response.output_item.done` for each item, then
 * `response.completed` carrying the whole response and its usage), else as one JSON response;
 * `GET /v1/models`; and the API's own error bodies (401 `invalid_api_key` for a wrong bearer,
 * 404 for any other route).
 *
 * What each call answers is the test's `reply(request)`; every request is recorded, so a test
 * can check what the agent sent (the model, the instructions, the input, the headers).
 */
import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { type ApiRequest, pieces, startModelApi } from './model-api.ts';

/** An output item of a reply, before it is cut into stream events. */
export type ReplyItem =
  | { type: 'text'; text: string }
  | { type: 'reasoning'; summary: string }
  | { type: 'function_call'; name: string; arguments: Record<string, unknown>; call_id?: string };

export interface Reply {
  output: ReplyItem[];
}

/** One request the fake received. `body` is the parsed JSON body (null for none or bad JSON). */
export type SeenRequest = ApiRequest<ResponsesBody>;

/** The parts of a Responses API request body the tests look at. */
export interface ResponsesBody {
  model?: string;
  stream?: boolean;
  instructions?: string;
  tools?: { type: string; name?: string }[];
  /** Messages (`{role, content}`), function calls and their outputs (`{type: 'function_call_output'}`). */
  input?: string | { type?: string; role?: string; content?: unknown; [k: string]: unknown }[];
}

export interface FakeOpenAI {
  url: string;
  seen: SeenRequest[];
  /** The `/v1/responses` requests, in arrival order. */
  responses(): SeenRequest[];
  /** The usage the fake reported, summed over every `/v1/responses` answer so far. */
  usageSent: { input: number; output: number };
  close(): Promise<void>;
}

/** Tokens, the fake's way: one per started 4 characters (the real API's rough ratio). */
export const tokensOf = (text: string) => Math.ceil(text.length / 4);

/** All text of a request's input items of `role` (or of every message), in order. */
export function inputText(body: ResponsesBody | null | undefined, role?: string): string {
  const input = body?.input;
  if (typeof input === 'string') return role === undefined || role === 'user' ? input : '';
  return (input ?? [])
    .filter((i) => (i.type === undefined || i.type === 'message') && (role === undefined || i.role === role))
    .map((i) =>
      typeof i.content === 'string'
        ? i.content
        : ((i.content ?? []) as { text?: string }[]).map((c) => (typeof c.text === 'string' ? c.text : '')).join(''),
    )
    .join('\n');
}

function send(res: ServerResponse, status: number, body: unknown, requestId: string) {
  res.writeHead(status, { 'content-type': 'application/json', 'x-request-id': requestId });
  res.end(JSON.stringify(body));
}

const error = (type: string, code: string | null, message: string) => ({
  error: { message, type, param: null, code },
});

const id = (prefix: string) => `${prefix}_${randomBytes(12).toString('hex')}`;

type OutputItem =
  | {
      type: 'message';
      id: string;
      status: 'completed';
      role: 'assistant';
      content: { type: 'output_text'; text: string; annotations: [] }[];
    }
  | { type: 'reasoning'; id: string; summary: { type: 'summary_text'; text: string }[] }
  | { type: 'function_call'; id: string; call_id: string; name: string; arguments: string; status: 'completed' };

/** The reply's items as the API's output items (ids filled in, arguments as a JSON string). */
function outputOf(reply: Reply): OutputItem[] {
  return reply.output.map((item): OutputItem => {
    if (item.type === 'function_call')
      return {
        type: 'function_call',
        id: id('fc'),
        call_id: item.call_id ?? id('call'),
        name: item.name,
        arguments: JSON.stringify(item.arguments),
        status: 'completed',
      };
    if (item.type === 'reasoning')
      return { type: 'reasoning', id: id('rs'), summary: [{ type: 'summary_text', text: item.summary }] };
    return {
      type: 'message',
      id: id('msg'),
      status: 'completed',
      role: 'assistant',
      content: [{ type: 'output_text', text: item.text, annotations: [] }],
    };
  });
}

export async function startFakeOpenAI(options: {
  /** The one bearer token accepted. */
  apiKey: string;
  /** What `GET /v1/models` lists (the service pings it to validate a credential). */
  models?: string[];
  reply(request: ResponsesBody): Reply;
}): Promise<FakeOpenAI> {
  const seen: SeenRequest[] = [];
  const usageSent = { input: 0, output: 0 };
  const server = await startModelApi<ResponsesBody>((req, res) => {
    const { path, body } = req;
    seen.push(req);
    const requestId = id('req');
    const route = `${req.method} ${path}`;
    if (!['POST /v1/responses', 'GET /v1/models'].includes(route)) {
      return send(res, 404, error('invalid_request_error', 'unknown_url', `Invalid URL (${route})`), requestId);
    }
    if (req.headers.authorization !== `Bearer ${options.apiKey}`) {
      return send(
        res,
        401,
        error('invalid_request_error', 'invalid_api_key', 'Incorrect API key provided.'),
        requestId,
      );
    }
    if (route === 'GET /v1/models') {
      const data = (options.models ?? []).map((m) => ({
        id: m,
        object: 'model',
        created: 1_700_000_000,
        owned_by: 'openai',
      }));
      return send(res, 200, { object: 'list', data }, requestId);
    }
    if (!body || typeof body.model !== 'string' || body.input === undefined) {
      return send(
        res,
        400,
        error('invalid_request_error', 'missing_required_parameter', "Missing required parameter: 'model'."),
        requestId,
      );
    }
    const output = outputOf(options.reply(body));
    const inputTokens = tokensOf(JSON.stringify(body.input) + (body.instructions ?? ''));
    const outputTokens = tokensOf(JSON.stringify(output));
    usageSent.input += inputTokens;
    usageSent.output += outputTokens;
    const response = {
      id: id('resp'),
      object: 'response',
      created_at: Math.floor(Date.now() / 1000),
      model: body.model,
      status: 'in_progress',
      error: null,
      incomplete_details: null,
      instructions: body.instructions ?? null,
      output: [] as OutputItem[],
      parallel_tool_calls: true,
      tool_choice: 'auto',
      tools: body.tools ?? [],
      usage: null as unknown,
    };
    const done = {
      ...response,
      status: 'completed',
      output,
      usage: {
        input_tokens: inputTokens,
        input_tokens_details: { cached_tokens: 0 },
        output_tokens: outputTokens,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: inputTokens + outputTokens,
      },
    };
    if (!body.stream) return send(res, 200, done, requestId);
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      'x-request-id': requestId,
    });
    let sequence = 0;
    const event = (type: string, data: object) =>
      res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...data })}\n\n`);
    event('response.created', { response });
    event('response.in_progress', { response });
    output.forEach((item, output_index) => {
      if (item.type === 'message') {
        const text = item.content[0]?.text ?? '';
        event('response.output_item.added', { output_index, item: { ...item, status: 'in_progress', content: [] } });
        const at = { item_id: item.id, output_index, content_index: 0 };
        event('response.content_part.added', { ...at, part: { type: 'output_text', text: '', annotations: [] } });
        for (const delta of pieces(text, 8)) event('response.output_text.delta', { ...at, delta });
        event('response.output_text.done', { ...at, text });
        event('response.content_part.done', { ...at, part: { type: 'output_text', text, annotations: [] } });
      } else if (item.type === 'reasoning') {
        const text = item.summary[0]?.text ?? '';
        event('response.output_item.added', { output_index, item: { ...item, summary: [] } });
        const at = { item_id: item.id, output_index, summary_index: 0 };
        event('response.reasoning_summary_part.added', { ...at, part: { type: 'summary_text', text: '' } });
        for (const delta of pieces(text, 8)) event('response.reasoning_summary_text.delta', { ...at, delta });
        event('response.reasoning_summary_text.done', { ...at, text });
        event('response.reasoning_summary_part.done', { ...at, part: { type: 'summary_text', text } });
      } else {
        event('response.output_item.added', {
          output_index,
          item: { ...item, arguments: '', status: 'in_progress' },
        });
        for (const delta of pieces(item.arguments, 8))
          event('response.function_call_arguments.delta', { item_id: item.id, output_index, delta });
        event('response.function_call_arguments.done', {
          item_id: item.id,
          output_index,
          arguments: item.arguments,
        });
      }
      event('response.output_item.done', { output_index, item });
    });
    event('response.completed', { response: done });
    res.end();
  });
  return {
    ...server,
    seen,
    responses: () => seen.filter((r) => r.method === 'POST' && r.path === '/v1/responses'),
    usageSent,
  };
}
