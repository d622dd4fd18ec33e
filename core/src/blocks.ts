/**
 * The block parser (SPEC "Log event", `?blocks=true`): turns one log event's data into the
 * blocks a client renders. Understands Claude Code's `--output-format stream-json` lines on
 * stdout/stderr and ACP `session/update` (and `session/request_permission`) params on the
 * `acp` stream. Anything it does not recognise becomes a `raw` block: shown, never dropped.
 * Pure, and total: it never throws, whatever the bytes.
 */
export type Block =
  | { kind: 'text'; body: string }
  | { kind: 'thinking'; body: string }
  | { kind: 'tool_use'; id: string; name: string; summary: string; body: string }
  | { kind: 'tool_result'; tool_id: string; body: string; error: boolean }
  | { kind: 'init'; summary: string; body: string }
  | { kind: 'result'; body: string; raw: string }
  | { kind: 'error'; body: string }
  | { kind: 'raw'; body: string; summary: string }
  | {
      kind: 'permission_request';
      request_id: string;
      summary: string;
      request: unknown;
      options: { optionId: string; name: string; kind: string }[];
    };

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const str = (v: unknown): string =>
  typeof v === 'string' ? v : v === undefined || v === null ? '' : JSON.stringify(v);
const short = (s: string, n = 120) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);
const raw = (body: string, summary?: string): Block => ({
  kind: 'raw',
  body,
  summary: summary ?? short(body.split('\n')[0] ?? ''),
});

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/**
 * A one-line description of what a tool call does: its name with the command, the file, the
 * pattern, the URL or the query of its input (or the first file of its ACP `locations`), the
 * name alone when that already says it (a runtime may title a Bash call with its command).
 */
function toolSummary(name: string, input: unknown, locations?: unknown): string {
  let what: string | undefined;
  if (isObject(input)) {
    for (const key of ['command', 'file_path', 'path', 'notebook_path', 'pattern', 'url', 'query', 'description']) {
      const value = input[key];
      // Some runtimes give a command as its argv.
      const text = Array.isArray(value) && value.every((v) => typeof v === 'string') ? value.join(' ') : value;
      if (typeof text === 'string' && text) {
        what = text;
        break;
      }
    }
  }
  if (what === undefined && Array.isArray(locations)) {
    const first = locations[0];
    if (isObject(first) && typeof first.path === 'string') what = first.path;
  }
  const plain = name.replaceAll('`', '');
  const said = what === undefined || plain === what || plain.endsWith(` ${what}`);
  return short(said ? name : `${name}: ${what}`);
}

/** An ACP tool call, or an update that says more of what it does: a `tool_use` block. */
function toolUse(u: Record<string, unknown>): Block {
  const name = str(u.title) || str(u.kind) || 'tool';
  return {
    kind: 'tool_use',
    id: str(u.toolCallId),
    name,
    summary: toolSummary(name, u.rawInput, u.locations),
    body: JSON.stringify(u.rawInput ?? {}),
  };
}

/** Text of a tool result's content: a string, or the text parts of a content list. */
function resultText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((c) => {
        if (isObject(c) && typeof c.text === 'string') return c.text;
        if (isObject(c) && isObject(c.content) && typeof c.content.text === 'string') return c.content.text;
        return str(c);
      })
      .join('');
  }
  return str(content);
}

/** One Claude Code stream-json object. */
function claudeBlocks(line: string, o: Json): Block[] {
  switch (o.type) {
    case 'system':
      if (o.subtype === 'init') {
        const tools = Array.isArray(o.tools) ? o.tools.length : 0;
        return [{ kind: 'init', summary: short(`${str(o.model) || 'session'} started, ${tools} tools`), body: line }];
      }
      return [raw(line)];
    case 'assistant':
    case 'user': {
      const message = isObject(o.message) ? o.message : undefined;
      const content = message?.content;
      if (typeof content === 'string')
        return [o.type === 'assistant' ? { kind: 'text', body: content } : raw(content, 'user message')];
      if (!Array.isArray(content)) return [raw(line)];
      const out: Block[] = [];
      for (const c of content) {
        if (!isObject(c)) {
          out.push(raw(str(c)));
        } else if (c.type === 'text') {
          out.push(o.type === 'assistant' ? { kind: 'text', body: str(c.text) } : raw(str(c.text), 'user message'));
        } else if (c.type === 'thinking') {
          out.push({ kind: 'thinking', body: str(c.thinking) });
        } else if (c.type === 'tool_use') {
          const name = str(c.name);
          out.push({
            kind: 'tool_use',
            id: str(c.id),
            name,
            summary: toolSummary(name, c.input),
            body: JSON.stringify(c.input ?? {}),
          });
        } else if (c.type === 'tool_result') {
          out.push({
            kind: 'tool_result',
            tool_id: str(c.tool_use_id),
            body: resultText(c.content),
            error: c.is_error === true,
          });
        } else {
          out.push(raw(JSON.stringify(c)));
        }
      }
      return out;
    }
    case 'result': {
      const body = str(o.result);
      if (o.is_error === true || (typeof o.subtype === 'string' && o.subtype.startsWith('error'))) {
        return [
          { kind: 'error', body: body || str(o.subtype) },
          { kind: 'result', body, raw: line },
        ];
      }
      return [{ kind: 'result', body, raw: line }];
    }
    default:
      return [raw(line)];
  }
}

/** One ACP notification's params: `session/update`, or a `session/request_permission` request. */
function acpBlocks(data: string, o: Json): Block[] {
  if (Array.isArray(o.options) && isObject(o.toolCall)) {
    const tool = o.toolCall;
    const options = o.options
      .filter(isObject)
      .map((opt) => ({ optionId: str(opt.optionId), name: str(opt.name), kind: str(opt.kind) }));
    return [
      {
        kind: 'permission_request',
        request_id: str(o.requestId ?? tool.toolCallId),
        summary: short(`Allow ${str(tool.title) || str(tool.kind) || 'tool'}?`),
        request: tool,
        options,
      },
    ];
  }
  const u = isObject(o.update) ? o.update : undefined;
  if (!u) return [raw(data)];
  const content = isObject(u.content) ? u.content : undefined;
  const text = content && content.type === 'text' ? str(content.text) : undefined;
  switch (u.sessionUpdate) {
    case 'agent_message_chunk':
      return text === undefined ? [raw(data)] : [{ kind: 'text', body: text }];
    case 'agent_thought_chunk':
      return text === undefined ? [raw(data)] : [{ kind: 'thinking', body: text }];
    case 'user_message_chunk':
      return [raw(text ?? data, 'user message')];
    case 'tool_call':
      return [toolUse(u)];
    case 'tool_call_update':
      if (u.status === 'completed' || u.status === 'failed') {
        const body = u.content !== undefined && u.content !== null ? resultText(u.content) : str(u.rawOutput);
        return [{ kind: 'tool_result', tool_id: str(u.toolCallId), body, error: u.status === 'failed' }];
      }
      // Claude Code's call starts with its input still streaming (`{}`, titled "Terminal"); the
      // update with the whole input refines it: a tool_use of the same id that says what it does.
      if ((isObject(u.rawInput) && Object.keys(u.rawInput).length > 0) || str(u.title)) return [toolUse(u)];
      return [raw(data, short(`${str(u.toolCallId)} ${str(u.status) || 'update'}`))];
    default:
      return [raw(data, short(str(u.sessionUpdate) || 'update'))];
  }
}

/** The blocks of one event: `[]` for an event that is not output. */
export function blocksOf(event: { kind: string; stream: string; data: string | null }): Block[] {
  try {
    if (event.kind !== 'output' || !event.data) return [];
    if (event.stream === 'acp') {
      const o = parseJson(event.data);
      return isObject(o) ? acpBlocks(event.data, o) : [raw(event.data)];
    }
    const out: Block[] = [];
    // Output may carry several stream-json lines, or plain text; keep line endings of text.
    for (const line of event.data.split(/(?<=\n)/)) {
      const trimmed = line.trim();
      if (trimmed === '') {
        if (line.length) out.push(raw(line, ''));
        continue;
      }
      const o = trimmed.startsWith('{') ? parseJson(trimmed) : undefined;
      out.push(...(isObject(o) && typeof o.type === 'string' ? claudeBlocks(trimmed, o) : [raw(line)]));
    }
    return out;
  } catch {
    return [raw(event.data ?? '')];
  }
}
