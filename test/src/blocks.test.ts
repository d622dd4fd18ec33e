import { readFileSync } from 'node:fs';
import { blocksOf } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';

const fixture = (name: string) => readFileSync(new URL(`../fixtures/${name}`, import.meta.url), 'utf8');
const out = (data: string, stream = 'stdout') => ({ kind: 'output', stream, data });

t.test('Claude Code stream-json lines become init, thinking, text, tool_use, tool_result, result', async (t) => {
  const lines = fixture('claude-stream-json.jsonl').trim().split('\n');
  const blocks = lines.flatMap((l) => blocksOf(out(`${l}\n`)));
  t.same(
    blocks.map((b) => b.kind),
    ['init', 'thinking', 'text', 'tool_use', 'tool_result', 'tool_use', 'tool_result', 'result'],
  );
  t.match(blocks[0], { kind: 'init', summary: 'claude-sonnet-4-5-20250929 started, 8 tools' });
  t.match(blocks[3], { kind: 'tool_use', id: 'toolu_01AbC', name: 'Bash', summary: 'Bash: npm test' });
  t.same(JSON.parse((blocks[3] as { body: string }).body), { command: 'npm test', description: 'Run the tests' });
  t.match(blocks[4], { kind: 'tool_result', tool_id: 'toolu_01AbC', body: '12 passed, 0 failed', error: false });
  t.match(blocks[6], { kind: 'tool_result', tool_id: 'toolu_01GhI', error: true });
  t.match(blocks[7], { kind: 'result', body: 'All 12 tests pass.' });
  const several = blocksOf(out(`${lines[2]}\n${lines[3]}\n`));
  t.same(
    several.map((b) => b.kind),
    ['text', 'tool_use'],
    'one chunk may carry several lines',
  );
});

t.test('ACP updates become the same blocks, and a permission request carries its options', async (t) => {
  const acp = JSON.parse(fixture('acp-updates.json')) as { updates: unknown[]; permission: unknown };
  const blocks = acp.updates.flatMap((u) => blocksOf(out(JSON.stringify(u), 'acp')));
  t.same(
    blocks.map((b) => b.kind),
    ['thinking', 'text', 'tool_use', 'raw', 'tool_result', 'tool_result', 'raw'],
  );
  t.match(blocks[2], { id: 'call_1', name: 'Run npm test', summary: 'Run npm test' }, 'the title says it already');
  t.match(blocks[4], { tool_id: 'call_1', body: '12 passed', error: false });
  t.match(blocks[5], { tool_id: 'call_2', error: true });
  const [permission] = blocksOf(out(JSON.stringify(acp.permission), 'acp'));
  t.match(permission, { kind: 'permission_request', request_id: 'call_3', summary: 'Allow rm -rf build?' });
  t.same(
    (permission as { options: { kind: string }[] }).options.map((o) => o.kind),
    ['allow_once', 'allow_always', 'reject_once', 'reject_always'],
  );
});

t.test('a tool call says what it does: the command, the file, the query, for every runtime', async (t) => {
  const acp = (update: Record<string, unknown>) =>
    blocksOf(out(JSON.stringify({ sessionId: 's', update }), 'acp')) as Record<string, unknown>[];
  // Claude Code (claude-agent-acp): the call opens while its input still streams, then an
  // update with the whole input refines it.
  const [opened] = acp({
    sessionUpdate: 'tool_call',
    toolCallId: 'toolu_1',
    title: 'Terminal',
    kind: 'execute',
    status: 'pending',
    rawInput: {},
  });
  t.match(opened, { kind: 'tool_use', id: 'toolu_1', summary: 'Terminal' });
  const [refined] = acp({
    sessionUpdate: 'tool_call_update',
    toolCallId: 'toolu_1',
    title: 'ls -la src',
    kind: 'execute',
    rawInput: { command: 'ls -la src', description: 'List the sources' },
  });
  t.match(refined, { kind: 'tool_use', id: 'toolu_1', name: 'ls -la src', summary: 'ls -la src' });
  t.same(JSON.parse(refined?.body as string), { command: 'ls -la src', description: 'List the sources' });
  // A file it reads, named by its input or only by the call's locations.
  t.match(
    acp({
      sessionUpdate: 'tool_call',
      toolCallId: 'r',
      title: 'Read',
      kind: 'read',
      rawInput: { file_path: '/w/a.ts' },
    })[0],
    {
      summary: 'Read: /w/a.ts',
    },
  );
  t.match(
    acp({
      sessionUpdate: 'tool_call',
      toolCallId: 'g',
      title: 'ReadFile',
      kind: 'read',
      locations: [{ path: '/w/b.ts' }],
    })[0],
    {
      summary: 'ReadFile: /w/b.ts',
    },
  );
  // A search, and a command given as its argv (Codex).
  t.match(
    acp({
      sessionUpdate: 'tool_call',
      toolCallId: 'q',
      title: 'Search',
      kind: 'search',
      rawInput: { query: 'TODO' },
    })[0],
    {
      summary: 'Search: TODO',
    },
  );
  t.match(
    acp({
      sessionUpdate: 'tool_call',
      toolCallId: 'c',
      title: 'Run',
      kind: 'execute',
      rawInput: { command: ['bash', '-lc', 'npm test'] },
    })[0],
    {
      summary: 'Run: bash -lc npm test',
    },
  );
  // An update that says nothing new stays raw: no second tool call.
  t.match(acp({ sessionUpdate: 'tool_call_update', toolCallId: 'toolu_1', _meta: { terminal_output: 'x' } })[0], {
    kind: 'raw',
  });
});

t.test('events that are not output have no blocks; unknown lines are raw, never dropped', async (t) => {
  t.same(blocksOf({ kind: 'stage', stream: 'stage', data: null }), []);
  const plain = blocksOf(out('npm WARN deprecated\n{"not":"stream-json"}\n{broken json\n'));
  t.same(
    plain.map((b) => b.kind),
    ['raw', 'raw', 'raw'],
  );
  t.same(
    plain.map((b) => (b as { body: string }).body).join(''),
    'npm WARN deprecated\n{"not":"stream-json"}\n{broken json\n',
  );
});

t.test('property: no input throws, and text that is not stream-json comes back whole', async (t) => {
  fc.assert(
    fc.property(fc.string({ maxLength: 400 }), fc.constantFrom('stdout', 'stderr', 'acp'), (data, stream) => {
      const blocks = blocksOf(out(data, stream));
      if (data === '') return blocks.length === 0;
      if (blocks.length === 0) return false;
      // Only raw blocks for input that is no JSON at all: then their bodies rebuild it exactly.
      const isJsonish = data.split('\n').some((l) => l.trim().startsWith('{'));
      if (stream !== 'acp' && !isJsonish) return blocks.map((b) => (b as { body: string }).body).join('') === data;
      return true;
    }),
    { numRuns: 1000 },
  );
  fc.assert(
    fc.property(fc.jsonValue(), (v) => {
      for (const stream of ['stdout', 'acp']) blocksOf(out(JSON.stringify(v), stream));
      blocksOf(out(JSON.stringify({ type: 'assistant', message: { content: v } })));
      blocksOf(
        out(JSON.stringify({ update: { sessionUpdate: 'tool_call_update', status: 'completed', content: v } }), 'acp'),
      );
      return true;
    }),
    { numRuns: 500 },
  );
  t.pass('1,500 random inputs');
});
