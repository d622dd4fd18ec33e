/**
 * No input makes a 500: a property test that walks `/api/openapi.json` and sends every
 * operation malformed bodies, ids, queries and Last-Event-ID headers (NUL characters, lone
 * surrogates, wrong types, huge and empty values, bodies that are not JSON). Every answer comes
 * back within the timeout, under 500, and every 4xx on `/api` is `{error, message}`. The
 * operations come from the description, so routes added later are covered by construction.
 */
import fc from 'fast-check';
import t from 'tap';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';

/** Property runs per operation; each run is one request. */
const RUNS = Number(process.env.MALFORMED_RUNS ?? 12);
const REQUEST_TIMEOUT_MS = 15_000;

interface Operation {
  method: string;
  path: string;
  pathParams: string[];
  queryParams: string[];
  headerParams: string[];
  bodyTypes: string[];
  bodyFields: string[];
}

interface OpenApiDoc {
  paths: Record<
    string,
    Record<
      string,
      {
        parameters?: { in: string; name: string }[];
        requestBody?: { content?: Record<string, { schema?: { properties?: Record<string, unknown> } }> };
      }
    >
  >;
}

function operationsOf(doc: OpenApiDoc): Operation[] {
  const ops: Operation[] = [];
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const params = op.parameters ?? [];
      const content = op.requestBody?.content ?? {};
      const fields = new Set<string>();
      for (const media of Object.values(content))
        for (const f of Object.keys(media.schema?.properties ?? {})) fields.add(f);
      ops.push({
        method: method.toUpperCase(),
        path,
        pathParams: params.filter((p) => p.in === 'path').map((p) => p.name),
        queryParams: params.filter((p) => p.in === 'query').map((p) => p.name),
        headerParams: params.filter((p) => p.in === 'header').map((p) => p.name.toLowerCase()),
        bodyTypes: Object.keys(content),
        bodyFields: [...fields],
      });
    }
  }
  return ops;
}

/** Strings a careless server chokes on. */
const nasty = fc.oneof(
  fc.constantFrom(
    '\u0000',
    'a\u0000b',
    '',
    ' ',
    '../../etc/passwd',
    '%00',
    '🙂',
    '\ud800',
    'x'.repeat(5000),
    '-1',
    '0',
    '1e309',
    '9007199254740993',
    'null',
    'true',
    '[]',
    '{}',
    "'; drop table accounts; --",
    '2026-13-45T99:99:99Z',
  ),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ maxLength: 40 }),
);

/** A value of any JSON type, strings from `nasty`. */
const anyValue: fc.Arbitrary<unknown> = fc.oneof(
  nasty,
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.array(nasty, { maxLength: 3 }),
  fc.dictionary(nasty, nasty, { maxKeys: 3 }),
);

/** `s` with each lone surrogate (which a URL cannot carry) replaced by U+FFFD. */
const wellFormed = (s: string) =>
  s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\uFFFD');

/** A path segment: any string, made well-formed, encoded. */
const pathSegment = nasty.filter((s) => s !== '').map((s) => encodeURIComponent(wellFormed(s)));

/** A value fetch accepts in a header (no NUL, CR or LF) that is still not a valid event id. */
const headerValue = fc.oneof(
  fc.constantFrom('-1', 'abc', '1e309', '9007199254740993', '99999999999999999999', ' 12 ', '0x10', '1.5'),
  fc.string({ maxLength: 30 }).filter((s) => /^[\x20-\x7e]*$/.test(s)),
);

interface Request {
  path: string;
  headers: Record<string, string>;
  body?: string;
}

function requestFor(op: Operation): fc.Arbitrary<Request> {
  const segments = fc.tuple(...op.pathParams.map(() => pathSegment));
  const query = fc.dictionary(fc.constantFrom(...op.queryParams, 'unknown_param'), nasty, { maxKeys: 4 });
  const shaped = op.bodyFields.length
    ? fc.dictionary(fc.constantFrom(...op.bodyFields), anyValue, { maxKeys: op.bodyFields.length })
    : fc.dictionary(nasty, anyValue, { maxKeys: 3 });
  const body = fc.oneof(
    shaped.map((o) => ({ type: 'application/json', text: JSON.stringify(o) })),
    fc.jsonValue({ maxDepth: 2 }).map((v) => ({ type: 'application/json', text: JSON.stringify(v) })),
    fc.string({ maxLength: 40 }).map((s) => ({ type: 'application/json', text: `{${s}` })),
    nasty.map((s) => ({ type: 'text/plain', text: s })),
    nasty.map((s) => ({ type: 'application/x-www-form-urlencoded', text: `${encodeURIComponent('x')}=${s}` })),
  );
  const lastEventId = op.headerParams.includes('last-event-id') ? fc.option(headerValue) : fc.constant(null);
  return fc.record({ segments, query, body, lastEventId }).map(({ segments, query, body, lastEventId }) => {
    let i = 0;
    let path = op.path.replace(/\{[^}]+\}/g, () => segments[i++] as string);
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) search.append(k, wellFormed(v));
    if ([...search].length) path += `?${search}`;
    const headers: Record<string, string> = {};
    if (lastEventId !== null) headers['last-event-id'] = lastEventId;
    if (op.method === 'GET' || op.method === 'HEAD') return { path, headers };
    headers['content-type'] = body.type;
    return { path, headers, body: body.text };
  });
}

t.test(
  'malformed bodies, ids and queries to every operation: no 5xx, no hang, every 4xx {error, message}',
  async (t) => {
    const svc = await startTestService(t, { backend: primaryBackend() });
    const me = await signUp(svc);
    const doc = (await (await fetch(`${svc.url}/api/openapi.json`)).json()) as OpenApiDoc;
    const ops = operationsOf(doc);
    t.ok(ops.length >= 80, `the description lists ${ops.length} operations`);

    for (const op of ops) {
      // Revoking or signing out the presented key would leave the rest of the walk unauthenticated.
      const withKey = !['/api/oauth/revoke', '/api/auth/logout'].includes(op.path);
      const failures: string[] = [];
      await fc
        .assert(
          fc.asyncProperty(requestFor(op), async (req) => {
            const headers: Record<string, string> = { ...req.headers };
            if (withKey) headers.authorization = `Bearer ${me.key}`;
            const abort = new AbortController();
            const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
            const what = `${op.method} ${req.path} ${req.body === undefined ? '' : `(${headers['content-type']}) ${req.body.slice(0, 200)}`}`;
            let res: Response;
            try {
              res = await fetch(`${svc.url}${req.path}`, {
                method: op.method,
                headers,
                body: req.body,
                redirect: 'manual',
                signal: abort.signal,
              });
            } catch (err) {
              clearTimeout(timer);
              failures.push(`${what}: no answer within ${REQUEST_TIMEOUT_MS} ms (${(err as Error).message})`);
              return false;
            }
            try {
              if (res.headers.get('content-type')?.startsWith('text/event-stream')) {
                // A stream that opened: its status is the answer; do not wait for its end.
                abort.abort();
                if (res.status >= 500) failures.push(`${what}: ${res.status}`);
                return res.status < 500;
              }
              const text = await res.text();
              clearTimeout(timer);
              if (res.status >= 500) {
                failures.push(`${what}: ${res.status} ${text.slice(0, 300)}`);
                return false;
              }
              if (res.status >= 400 && op.path.startsWith('/api/')) {
                let body: { error?: unknown; message?: unknown } | undefined;
                try {
                  body = JSON.parse(text);
                } catch {}
                if (typeof body?.error !== 'string' || typeof body.message !== 'string') {
                  failures.push(`${what}: ${res.status} without {error, message}: ${text.slice(0, 300)}`);
                  return false;
                }
              }
              return true;
            } finally {
              clearTimeout(timer);
            }
          }),
          { numRuns: RUNS, endOnFailure: true },
        )
        .catch(() => {});
      t.same(failures, [], `${op.method} ${op.path}`);
    }

    const me2 = await fetch(`${svc.url}/api/auth/me`, { headers: { authorization: `Bearer ${me.key}` } });
    t.equal(me2.status, 200, 'the walk kept its key: the service still answers it');
  },
);

t.test('a NUL in a string field is 422 validation_failed naming the field, and nothing is stored', async (t) => {
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '3000' },
  });
  const me = await signUp(svc);
  const token = me.key;
  const http = svc.http;

  const env = await http.post('/api/environments', { token, body: { name: 'bad\u0000name' } });
  t.equal(env.status, 422);
  t.same(env.body.details, { name: ['must not contain the NUL character (U+0000)'] });
  t.same((await http.get('/api/environments', { token })).body.data, [], 'no environment was made');

  const nested = await http.post('/api/environments', {
    token,
    body: {
      name: 'ok',
      env_vars: { GOOD: 'x', BAD: 'a\u0000' },
      packages: { 'np\u0000m': [], other: ['git', 'c\u0000url'] },
    },
  });
  t.equal(nested.status, 422);
  t.same(Object.keys(nested.body.details).sort(), ['env_vars.BAD', 'packages.np\\u0000m', 'packages.other.1']);

  const conv = await http.post('/api/conversations', { token, body: { agent_id: 'ag\u0000' } });
  t.equal(conv.status, 422);
  t.same(conv.body.details, { agent_id: ['must not contain the NUL character (U+0000)'] });

  const forgot = await http.post('/api/auth/forgot', { body: { email: 'a\u0000@example.com' } });
  t.equal(forgot.status, 422);
  t.same(Object.keys(forgot.body.details), ['email']);

  const query = await http.get(`/api/agents?search=${encodeURIComponent('x\u0000')}`, { token });
  t.equal(query.status, 400);
  t.equal(query.body.error, 'invalid_request');
  t.match(query.body.message, /search/);

  const param = await http.get(`/api/agents/${encodeURIComponent('a\u0000b')}`, { token });
  t.equal(param.status, 400);
  t.equal(param.body.error, 'invalid_request');

  t.test('a prompt is content: its NUL is kept as U+FFFD, as in the log', async (t) => {
    const { agent } = await claudeAgent(t, http, token);
    const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'say\u0000hi' } });
    t.equal(res.status, 201, res.text);
    const turns = (await http.get(`/api/conversations/${res.body.id}/turns`, { token })).body.data;
    t.equal(turns[0]?.prompt, 'say\uFFFDhi');
    await http.post(`/api/conversations/${res.body.id}/terminate`, { token });
  });
});
