/**
 * A local stand-in for the Anthropic Messages API as Claude Code uses it, speaking its wire
 * format: `POST /v1/messages` answered as a server-sent event stream when the body says
 * `"stream": true` (`message_start`, `content_block_start`, `ping`, `content_block_delta` with
 * `text_delta` / `thinking_delta` / `signature_delta` / `input_json_delta`,
 * `content_block_stop`, `message_delta` carrying `stop_reason` and usage, `message_stop`), else
 * as one JSON message; `POST /v1/messages/count_tokens`; `GET /v1/models`; and the provider's
 * own error bodies (401 `authentication_error` for a wrong `x-api-key`, 404 `not_found_error`
 * for any other route, such as the `HEAD /` Claude Code sends first to warm its connection).
 *
 * What each call answers is the test's `reply(request)`; every request is recorded, so a test
 * can check what the agent sent (the prompt, the model, the tool results, the headers).
 */
import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { type ApiRequest, pieces, startModelApi } from './model-api.ts';

/** A content block of a reply, before it is cut into stream events. */
export type ReplyBlock =
  | { type: 'text'; text: string }
  | { type: 'thinking'; thinking: string }
  | { type: 'tool_use'; name: string; input: Record<string, unknown>; id?: string };

export interface Reply {
  content: ReplyBlock[];
  /** `end_turn` unless given, or `tool_use` when the content has a tool_use block. */
  stop_reason?: 'end_turn' | 'tool_use' | 'max_tokens' | 'stop_sequence';
}

/** One request the fake received. `body` is the parsed JSON body (null for none or bad JSON). */
export type SeenRequest = ApiRequest<MessagesBody>;

/** The parts of a Messages API request body the tests look at. */
export interface MessagesBody {
  model?: string;
  stream?: boolean;
  max_tokens?: number;
  system?: unknown;
  tools?: { name: string }[];
  messages?: { role: 'user' | 'assistant'; content: string | { type: string; [k: string]: unknown }[] }[];
}

export interface FakeAnthropic {
  url: string;
  seen: SeenRequest[];
  /** The `/v1/messages` requests, in arrival order. */
  messages(): SeenRequest[];
  /** The usage the fake reported, summed over every `/v1/messages` answer so far. */
  usageSent: { input: number; output: number };
  close(): Promise<void>;
}

/** Tokens, the fake's way: one per started 4 characters (the real API's rough ratio). */
export const tokensOf = (text: string) => Math.ceil(text.length / 4);

/** All text of a message's content, tool results included. */
export function textOf(content: string | { type: string; [k: string]: unknown }[] | undefined): string {
  if (typeof content === 'string') return content;
  return (content ?? [])
    .map((b) => (typeof b.text === 'string' ? b.text : b.type === 'tool_result' ? textOf(b.content as never) : ''))
    .join('');
}

function send(res: ServerResponse, status: number, body: unknown, requestId: string) {
  res.writeHead(status, { 'content-type': 'application/json', 'request-id': requestId });
  res.end(JSON.stringify(body));
}

const error = (type: string, message: string) => ({ type: 'error', error: { type, message } });

type ContentBlock =
  | { type: 'text'; text: string }
  | { type: 'thinking'; thinking: string; signature: string }
  | { type: 'tool_use'; id: string; name: string; input: Record<string, unknown> };

/** The reply's blocks as the API's content blocks (ids filled in, thinking signed). */
function contentOf(reply: Reply): ContentBlock[] {
  return reply.content.map((b): ContentBlock => {
    if (b.type === 'tool_use')
      return { type: 'tool_use', id: b.id ?? `toolu_${randomBytes(12).toString('hex')}`, name: b.name, input: b.input };
    if (b.type === 'thinking') return { type: 'thinking', thinking: b.thinking, signature: 'fake-signature' };
    return { type: 'text', text: b.text };
  });
}

export async function startFakeAnthropic(options: {
  /** The one `x-api-key` accepted. */
  apiKey: string;
  /** What `GET /v1/models` lists (the service pings it to validate a credential). */
  models?: string[];
  reply(request: MessagesBody): Reply;
}): Promise<FakeAnthropic> {
  const seen: SeenRequest[] = [];
  const usageSent = { input: 0, output: 0 };
  const server = await startModelApi<MessagesBody>((req, res) => {
    const { path, body } = req;
    seen.push(req);
    const requestId = `req_${randomBytes(12).toString('hex')}`;
    const route = `${req.method} ${path}`;
    if (!['POST /v1/messages', 'POST /v1/messages/count_tokens', 'GET /v1/models'].includes(route)) {
      return send(res, 404, error('not_found_error', `${route} not found`), requestId);
    }
    if (req.headers['x-api-key'] !== options.apiKey) {
      return send(res, 401, error('authentication_error', 'invalid x-api-key'), requestId);
    }
    if (route === 'GET /v1/models') {
      const models = (options.models ?? []).map((id) => ({
        type: 'model',
        id,
        display_name: id,
        created_at: '2025-09-29T00:00:00Z',
      }));
      return send(
        res,
        200,
        { data: models, has_more: false, first_id: models[0]?.id ?? null, last_id: models.at(-1)?.id ?? null },
        requestId,
      );
    }
    if (route === 'POST /v1/messages/count_tokens') {
      const text = (body?.messages ?? []).map((m) => textOf(m.content)).join('');
      return send(res, 200, { input_tokens: tokensOf(text) }, requestId);
    }
    if (!body || typeof body.model !== 'string' || !Array.isArray(body.messages)) {
      return send(res, 400, error('invalid_request_error', 'model: Field required'), requestId);
    }
    const reply = options.reply(body);
    const content = contentOf(reply);
    const stopReason = reply.stop_reason ?? (content.some((b) => b.type === 'tool_use') ? 'tool_use' : 'end_turn');
    const usage = {
      input_tokens: tokensOf(JSON.stringify(body.messages) + JSON.stringify(body.system ?? '')),
      output_tokens: tokensOf(JSON.stringify(content)),
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: 0,
    };
    usageSent.input += usage.input_tokens;
    usageSent.output += usage.output_tokens;
    const message = {
      id: `msg_${randomBytes(12).toString('hex')}`,
      type: 'message',
      role: 'assistant',
      model: body.model,
    };
    if (!body.stream) {
      return send(res, 200, { ...message, content, stop_reason: stopReason, stop_sequence: null, usage }, requestId);
    }
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      'request-id': requestId,
    });
    const event = (type: string, data: object) =>
      res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
    event('message_start', {
      message: {
        ...message,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { ...usage, output_tokens: 1 },
      },
    });
    event('ping', {});
    content.forEach((block, index) => {
      if (block.type === 'text') {
        event('content_block_start', { index, content_block: { type: 'text', text: '' } });
        for (const text of pieces(block.text, 8))
          event('content_block_delta', { index, delta: { type: 'text_delta', text } });
      } else if (block.type === 'thinking') {
        event('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } });
        for (const thinking of pieces(block.thinking, 8))
          event('content_block_delta', { index, delta: { type: 'thinking_delta', thinking } });
        event('content_block_delta', { index, delta: { type: 'signature_delta', signature: block.signature } });
      } else {
        event('content_block_start', {
          index,
          content_block: { type: 'tool_use', id: block.id, name: block.name, input: {} },
        });
        for (const partial_json of pieces(JSON.stringify(block.input), 8))
          event('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } });
      }
      event('content_block_stop', { index });
    });
    event('message_delta', {
      delta: { stop_reason: stopReason, stop_sequence: null },
      usage: { output_tokens: usage.output_tokens },
    });
    event('message_stop', {});
    res.end();
  });
  return {
    ...server,
    seen,
    messages: () => seen.filter((r) => r.method === 'POST' && r.path === '/v1/messages'),
    usageSent,
  };
}

/**
 * The variables that keep Claude Code (and so claude-agent-acp) off the internet but for its
 * model API: no telemetry, error reports, auto-update, release notes or other non-essential
 * calls. Checked under strace with no network: with these set, the only outside name it still
 * looks up is raw.githubusercontent.com (its plugin blocklist), and that lookup failing
 * changes nothing.
 */
export const CLAUDE_CODE_OFFLINE: Readonly<Record<string, string>> = {
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  DISABLE_TELEMETRY: '1',
  DISABLE_ERROR_REPORTING: '1',
  DISABLE_AUTOUPDATER: '1',
};

/** The environment that points Claude Code at a fake at `url` and keeps it off the internet. */
export function claudeCodeEnv(url: string): Record<string, string> {
  return { ANTHROPIC_BASE_URL: url, ...CLAUDE_CODE_OFFLINE };
}
