// What a failed turn is told, checked at the seams the end-to-end tests (turn-errors) do not
// reach: a runtime's stderr dump folded into one line without losing a character, the words a
// runtime uses for a refused key or an unreachable provider, and a runner one release older
// that sends a bare error string.
import { readFileSync } from 'node:fs';
import { classifyRuntimeFailure, classifySpawnFailure, turnErrorOf } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';
import { foldDumpedObjects } from '../../runner-agent/src/stderr-lines.ts';

const DUMP = readFileSync(new URL('../fixtures/claude-agent-acp-error-dump.txt', import.meta.url), 'utf8')
  .split('\n')
  .slice(1, -1);

t.test("claude-agent-acp's dump of a failed prompt is one stderr line", async (t) => {
  const lines = ['Spawning Claude Code', ...DUMP, 'after it'];
  const folded = foldDumpedObjects(lines);
  t.same(folded, [
    'Spawning Claude Code',
    "Error handling request { jsonrpc: '2.0', id: 3, method: 'session/prompt', params: { sessionId: 'af83eb27-14ad-4dbc-85b7-160c5e4020cc', prompt: [ [Object] ] } } { code: -32603, message: 'Internal error: Invalid API key · Fix external API key', data: undefined }",
    'after it',
  ]);
  t.same(foldDumpedObjects(DUMP.slice(0, 5)), DUMP.slice(0, 5), 'a dump cut short is passed on as it came');
  t.same(foldDumpedObjects(["a '{' in quotes", 'x {', "  '}' too", '}']), ["a '{' in quotes", "x { '}' too }"]);
});

t.test('folding never loses, adds or reorders text, and never makes more lines', async (t) => {
  const line = fc.oneof(
    fc.string({ maxLength: 20 }),
    fc.constantFrom('{', '}', '[', ']', '} {', "  a: '{',", '  b: [ 1, 2 ]', 'x {', 'y [', '"}"'),
  );
  t.doesNotThrow(() =>
    fc.assert(
      fc.property(fc.array(line, { maxLength: 40 }), (lines) => {
        const folded = foldDumpedObjects(lines);
        const squeeze = (ls: string[]) => ls.join('').replace(/\s+/g, '');
        return folded.length <= lines.length && squeeze(folded) === squeeze(lines);
      }),
    ),
  );
});

t.test(
  "a runtime's words for a refused key or an unreachable provider become codes that say what to fix",
  async (t) => {
    const claude = { runtime: 'claude', command: 'claude-agent-acp' };
    t.match(classifyRuntimeFailure('Internal error: Invalid API key · Fix external API key', claude), {
      code: 'invalid_api_key',
      message: /^Anthropic refused the API key \(401\): .*anthropic_api_key.* The runtime said: Invalid API key/,
    });
    t.match(
      classifyRuntimeFailure('unexpected status 401 Unauthorized: Incorrect API key provided', { runtime: 'codex' }),
      { code: 'invalid_api_key', message: /^OpenAI refused/ },
    );
    t.match(classifyRuntimeFailure('403 Forbidden: permission denied for this API key', { runtime: 'gemini' }), {
      code: 'invalid_api_key',
      message: /^Google refused the API key \(403\): .*gemini_api_key/,
    });
    t.match(
      classifyRuntimeFailure(
        'Internal error: API Error: Unable to connect to API. Check your internet connection',
        claude,
      ),
      { code: 'provider_unreachable', message: /ANTHROPIC_BASE_URL/ },
    );
    t.match(classifyRuntimeFailure('request failed: connect ECONNREFUSED 127.0.0.1:9', {}), {
      code: 'provider_unreachable',
    });
    t.match(classifyRuntimeFailure('API Error: 529 {"type":"error","error":{"type":"overloaded_error"}}', claude), {
      code: 'provider_error',
    });
    t.match(classifyRuntimeFailure('ACP agent node (pid 4) exited with code 1 and wrote nothing to stderr', claude), {
      code: 'agent_crashed',
      message: 'The claude runtime failed the turn: ACP agent node (pid 4) exited with code 1',
    });
    const codexSaid = [
      'WARNING: proceeding, even though we could not update PATH',
      '\u001b[2m2026-11-25T04:24:02.149111Z\u001b[0m \u001b[31mERROR\u001b[0m codex_acp::thread: Unhandled error during turn: unexpected status 401 Unauthorized: Incorrect API key provided., url: http://127.0.0.1:39405/v1/responses',
      '',
    ];
    t.match(
      classifyRuntimeFailure('Internal error', { runtime: 'codex' }, codexSaid),
      {
        code: 'invalid_api_key',
        message:
          /The runtime said: 2026-11-25T04:24:02.149111Z ERROR codex_acp::thread: Unhandled error during turn: unexpected status 401/,
      },
      'a bare ACP error is explained by the newest stderr line that says something, its colours gone',
    );
    t.match(classifyRuntimeFailure('Internal error', { runtime: 'codex' }, ['all is well']), {
      code: 'agent_crashed',
      message: 'The codex runtime failed the turn: Internal error',
    });
    t.match(classifySpawnFailure('ENOENT', 'spawn gemini ENOENT', { runtime: 'gemini', command: 'gemini' }), {
      code: 'agent_not_installed',
      message: /gemini is not installed .*npm install -g @google\/gemini-cli.*RUNTIME_GEMINI_COMMAND/,
    });
  },
);

t.test('a runner one release older sends only an error string: the service classifies it', async (t) => {
  t.match(turnErrorOf(JSON.stringify({ usage: null, error: 'Internal error: Invalid API key' })), {
    code: 'invalid_api_key',
  });
  t.same(turnErrorOf(JSON.stringify({ usage: null, code: 'agent_not_installed', error: 'install it' })), {
    code: 'agent_not_installed',
    message: 'install it',
  });
  t.equal(turnErrorOf(JSON.stringify({ usage: null, stop_reason: 'end_turn' })), undefined, 'no error, none');
  t.equal(turnErrorOf('not json'), undefined);
});
