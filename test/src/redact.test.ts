import { blocksOf, type LogEvent, type NewEvent, REDACTED, SecretSet, StreamRedactor } from '@svc/core';
import fc from 'fast-check';
import t, { type Test } from 'tap';
import { createAppender, Redaction } from '../../gateway/src/log/log.append.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';

t.test('values of 8 bytes or more are replaced; shorter ones are left', async (t) => {
  const set = new SecretSet(['hunter2-password', 'short', 'sk-live-12345678']);
  t.equal(
    set.redact('pw hunter2-password and short and sk-live-12345678.'),
    `pw ${REDACTED} and short and ${REDACTED}.`,
  );
});

t.test('a value is also caught JSON-escaped, as it appears inside ACP payloads', async (t) => {
  const secret = 'pa"ss\\word-123';
  const set = new SecretSet([secret]);
  const acp = JSON.stringify({ content: { text: `the value is ${secret}` } });
  t.notOk(set.redact(acp).includes(JSON.stringify(secret).slice(1, -1)));
  t.match(set.redact(acp), REDACTED);
});

t.test('a value split across chunks of one stream is caught', async (t) => {
  const r = new StreamRedactor(new SecretSet(['ABCDEFGHIJ']));
  const out = [r.push('token: ABCD'), r.push('EFG'), r.push('HIJ done'), r.flush()];
  t.equal(out.join(''), `token: ${REDACTED} done`);
  t.notOk(
    out.some((c) => c.includes('ABCD') || c.includes('EFGHIJ')),
    'no chunk carries a piece that reveals it',
  );
});

t.test('property: however the output is chunked, nothing secret leaks and no other text is lost', async (t) => {
  const secretArb = fc.string({ minLength: 8, maxLength: 24, unit: fc.constantFrom('a', 'b', 'c', 'x', '-', '1') });
  fc.assert(
    fc.property(
      fc.uniqueArray(secretArb, { minLength: 1, maxLength: 4 }),
      fc.array(fc.oneof(fc.string({ maxLength: 12, unit: fc.constantFrom('a', 'b', 'z', ' ', '\n') }), fc.nat(3)), {
        maxLength: 20,
      }),
      fc.array(fc.nat(40), { maxLength: 10 }),
      (secrets, parts, cuts) => {
        // Build text from plain parts and secrets (a number picks a secret).
        const text = parts.map((p) => (typeof p === 'number' ? secrets[p % secrets.length] : p)).join('');
        const set = new SecretSet(secrets);
        const positions = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const chunks: string[] = [];
        let from = 0;
        for (const p of [...positions, text.length]) {
          chunks.push(text.slice(from, p));
          from = p;
        }
        const r = new StreamRedactor(set);
        const emitted = chunks.map((c) => r.push(c)).concat(r.flush());
        const joined = emitted.join('');
        if (joined !== set.redact(text)) return false;
        return secrets.every((s) => !joined.includes(s));
      },
    ),
    { numRuns: 500 },
  );
  t.pass('500 random chunkings');
});

// The write path (log.append.ts) over the in-memory log: what a runner sends, as it is stored.
const SECRET = 'sk-live-0123456789abcdef';
const SESSION = 'sess_0f3a';

function writePath(secrets: string[] = [SECRET, 'short']) {
  const log = memoryEventLog();
  const redaction = new Redaction();
  void redaction.register('acme', 'c1', secrets); // no store: the set is in place at once
  const append = createAppender(log, redaction);
  let next = 1;
  return {
    /** One append of the producer `r`, numbered after the previous one. */
    send: async (...events: NewEvent[]) => {
      const result = await append({ tenant: 'acme', producer: 'r', seq: next, events });
      next += events.length;
      return result;
    },
    /** An append numbered as given (a resend). */
    resend: (seq: number, ...events: NewEvent[]) => append({ tenant: 'acme', producer: 'r', seq, events }),
    stored: () => log.read('acme', { after: 0, limit: 100_000 }),
  };
}

const chunk = (text: string, kind = 'agent_message_chunk'): NewEvent => ({
  conversationId: 'c1',
  turnId: 't1',
  kind: 'output',
  stream: 'acp',
  data: JSON.stringify({ sessionId: SESSION, update: { sessionUpdate: kind, content: { type: 'text', text } } }),
});
const thought = (text: string) => chunk(text, 'agent_thought_chunk');
const output = (data: string, stream = 'stderr'): NewEvent => ({
  conversationId: 'c1',
  turnId: 't1',
  kind: 'output',
  stream,
  data,
});
const turnDone: NewEvent = {
  conversationId: 'c1',
  turnId: 't1',
  kind: 'stage',
  stream: 'stage',
  stage: 'turn',
  state: 'done',
};

/** The text a client reads: text blocks joined, thinking blocks joined, each output stream joined. */
function read(events: LogEvent[]) {
  const blocks = events.flatMap((e) => blocksOf(e));
  const join = (kind: string) =>
    blocks
      .filter((b) => b.kind === kind)
      .map((b) => (b as { body: string }).body)
      .join('');
  const stream = (name: string) =>
    events
      .filter((e) => e.stream === name)
      .map((e) => e.data)
      .join('');
  return { text: join('text'), thinking: join('thinking'), stderr: stream('stderr'), stdout: stream('stdout') };
}

/** Splits text into pieces of `size` characters (UTF-16 code units, so a pair may be cut). */
const pieces = (text: string, size: number) =>
  Array.from({ length: Math.ceil(text.length / size) }, (_, i) => text.slice(i * size, (i + 1) * size));

/** Every stored acp event is still a session/update of the session, as JSON. */
function assertAcpShape(t: Test, events: LogEvent[]) {
  for (const e of events.filter((x) => x.stream === 'acp')) {
    const params = JSON.parse(e.data ?? '');
    t.equal(params.sessionId, SESSION, 'same session');
    t.equal(e.turnId, 't1', 'same turn');
  }
}

t.test('the write path: a value split across 2 message chunks is [REDACTED] in the joined text', async (t) => {
  const w = writePath();
  await w.send(chunk('The key is sk-live-0123'));
  await w.send(chunk('456789abcdef, keep it.'));
  await w.send(turnDone);
  const events = await w.stored();
  t.equal(read(events).text, `The key is ${REDACTED}, keep it.`);
  t.notOk(JSON.stringify(events).includes('0123456789abcdef'), 'no stored byte carries the value');
  t.notOk(
    events.some((e) => e.data?.includes('sk-live-0123')),
    'nor the piece in the first chunk',
  );
  t.equal(events.length, 3, 'nothing was held at the end: no event added');
  assertAcpShape(t, events);
});

t.test('the write path: 3 chunks interleaved with stderr, which splits a value of its own', async (t) => {
  const w = writePath();
  await w.send(chunk('token: sk-li'), output('stderr has sk-live-01'));
  await w.send(chunk('ve-01234567'), output('23456789abcdef too\n'), output('other line\n'));
  await w.send(chunk('89abcdef.'), turnDone);
  const events = await w.stored();
  const { text, stderr } = read(events);
  t.equal(text, `token: ${REDACTED}.`, 'stderr events between the chunks do not release what they hold');
  t.equal(stderr, `stderr has ${REDACTED} too\nother line\n`, 'a value split across two stderr events');
  t.notOk(JSON.stringify(events).includes(SECRET));
  t.equal(events.at(-1)?.kind, 'stage');
});

t.test('the write path: a value in one-character chunks, and in many random cuts with stderr between', async (t) => {
  const w = writePath();
  for (const c of pieces(`Here: ${SECRET}!`, 1)) await w.send(chunk(c));
  await w.send(turnDone);
  const events = await w.stored();
  t.equal(read(events).text, `Here: ${REDACTED}!`);
  t.notOk(JSON.stringify(events).includes(SECRET));
  t.equal(events.length, `Here: ${SECRET}!`.length + 1, 'one event per chunk, held ones kept with empty text');
  assertAcpShape(t, events);

  const secretArb = fc.string({ minLength: 8, maxLength: 16, unit: fc.constantFrom('a', 'b', 'x', '-', '1', '"') });
  await fc.assert(
    fc.asyncProperty(
      fc.uniqueArray(secretArb, { minLength: 1, maxLength: 3 }),
      fc.array(fc.oneof(fc.string({ maxLength: 8, unit: fc.constantFrom('a', 'b', 'z', ' ') }), fc.nat(2)), {
        maxLength: 12,
      }),
      fc.array(fc.tuple(fc.integer({ min: 1, max: 6 }), fc.boolean(), fc.boolean()), { minLength: 1, maxLength: 40 }),
      async (secrets, parts, plan) => {
        const text = parts.map((p) => (typeof p === 'number' ? secrets[p % secrets.length] : p)).join('');
        const w = writePath(secrets);
        // Cut the text as the plan says; some chunks are thoughts, some followed by stderr.
        let at = 0;
        for (let i = 0; at < text.length; i++) {
          const [size, stderrAfter, batchWithNext] = plan[i % plan.length] as [number, boolean, boolean];
          const piece = text.slice(at, at + size);
          at += size;
          const batch = [chunk(piece), thought(piece)];
          if (stderrAfter) batch.push(output('noise\n'));
          if (batchWithNext) await w.send(...batch);
          else for (const e of batch) await w.send(e);
        }
        await w.send(turnDone);
        const events = await w.stored();
        const set = new SecretSet(secrets);
        const read1 = read(events);
        return (
          read1.text === set.redact(text) &&
          read1.thinking === set.redact(text) &&
          events.every((e) => secrets.every((s) => !e.data?.includes(JSON.stringify(s).slice(1, -1)))) &&
          events.at(-1)?.kind === 'stage'
        );
      },
    ),
    { numRuns: 200 },
  );
  t.pass('200 random chunkings of message and thought text, with stderr between');
});

t.test('the write path: thought and message texts are redacted each by itself', async (t) => {
  const w = writePath();
  await w.send(thought('I will print sk-live'), chunk('Printing'));
  await w.send(thought('-0123456789abcdef now.'), chunk(' it: sk-live-012'));
  await w.send(chunk('3456789abcdef'));
  // The end of the thoughts is a secret's start, the message goes on with the rest: not joined.
  await w.send(thought('sk-live-0123'), chunk('456789abcdef'), turnDone);
  const events = await w.stored();
  const { text, thinking } = read(events);
  t.equal(thinking, `I will print ${REDACTED} now.sk-live-0123`, 'a message chunk between thoughts changes nothing');
  t.equal(text, `Printing it: ${REDACTED}456789abcdef`, 'the thoughts’ end does not join the message’s start');
  const released = events.at(-2);
  t.equal(
    released?.data,
    JSON.stringify({
      sessionId: SESSION,
      update: { sessionUpdate: 'agent_thought_chunk', content: { type: 'text', text: 'sk-live-0123' } },
    }),
    'held thought text is released at the turn’s end as a thought chunk of the same session',
  );
  t.equal(events.at(-1)?.kind, 'stage');
});

t.test('the write path: a value with non-ASCII characters, cut inside a surrogate pair', async (t) => {
  const secret = 'clé-secrète-😀-ünïcode';
  const w = writePath([secret]);
  for (const c of pieces(`« ${secret} »`, 1)) await w.send(chunk(c));
  await w.send(turnDone);
  const events = await w.stored();
  t.equal(read(events).text, `« ${REDACTED} »`);
  t.notOk(JSON.stringify(events).includes('secrète'));
});

t.test('the write path: a chunk that starts like a value but diverges is released unchanged', async (t) => {
  const w = writePath();
  await w.send(chunk('almost sk-live-0123'));
  await w.send(chunk('4567 is not it'));
  await w.send(chunk(', nor sk-live-01234567'), turnDone);
  const events = await w.stored();
  t.equal(read(events).text, 'almost sk-live-01234567 is not it, nor sk-live-01234567', 'every character, in order');
  t.notOk(JSON.stringify(events).includes(REDACTED));
  t.same(
    events.map((e) => e.seq),
    [1, 2, 3, 4, 4],
    'the release takes the number of the stage it comes before',
  );
});

t.test('the write path: at the turn’s end, held text is released before the stage, once', async (t) => {
  const w = writePath();
  await w.send(chunk('See sk-live-0'), output('and sk-', 'stdout'));
  await w.send(turnDone);
  await w.send(chunk('Next turn.'), output('done\n', 'stdout'));
  const events = await w.stored();
  t.same(
    events.map(
      (e) =>
        `${e.stream}:${e.kind === 'stage' ? e.state : (JSON.parse(e.data?.startsWith('{') ? e.data : '""')?.update?.content?.text ?? e.data)}`,
    ),
    ['acp:See ', 'stdout:and ', 'stdout:sk-', 'acp:sk-live-0', 'stage:done', 'acp:Next turn.', 'stdout:done\n'],
  );
  t.equal(read(events).text, 'See sk-live-0Next turn.', 'nothing lost, nothing twice');
  assertAcpShape(t, events);
});

t.test('the write path: other ACP events release held text first and are redacted whole', async (t) => {
  const secret = 'pa"ss\\word-1234';
  const w = writePath([secret]);
  const toolCall: NewEvent = {
    ...output('', 'acp'),
    data: JSON.stringify({
      sessionId: SESSION,
      update: {
        sessionUpdate: 'tool_call',
        toolCallId: 'call_1',
        title: 'run',
        rawInput: { command: `echo ${secret}` },
      },
    }),
  };
  await w.send(chunk('Running with pa"ss'), toolCall, chunk('\\word-1234 done'));
  const events = await w.stored();
  t.same(
    events.map((e) => JSON.parse(e.data ?? '').update.sessionUpdate),
    ['agent_message_chunk', 'agent_message_chunk', 'tool_call', 'agent_message_chunk'],
    'the held text comes out as a chunk before the tool call',
  );
  t.equal(JSON.parse(events[2]?.data ?? '').update.rawInput.command, `echo ${REDACTED}`, 'JSON-escaped value');
  t.equal(read(events).text, 'Running with pa"ss\\word-1234 done', 'the tool call cut the text: no value in it');
  t.notOk(events.some((e) => e.data?.includes('pa\\"ss\\\\word-1234')));
});

t.test('the write path: a chunk keeps every other field of its JSON, and a resend leaves the text alone', async (t) => {
  const w = writePath();
  const data = JSON.stringify({
    sessionId: SESSION,
    update: {
      sessionUpdate: 'agent_message_chunk',
      content: { type: 'text', text: 'plain text. ', annotations: { priority: 1 } },
      _meta: { messageId: 'm1' },
    },
  });
  await w.send({ ...output(data, 'acp') });
  await w.send(chunk('value sk-live-0123'));
  // The runner did not hear back and sends the second chunk again.
  t.equal((await w.resend(2, chunk('value sk-live-0123'))).status, 'duplicate');
  await w.send(chunk('456789abcdef end'), turnDone);
  const events = await w.stored();
  t.equal(events[0]?.data, data, 'byte for byte');
  t.equal(read(events).text, `plain text. value ${REDACTED} end`);
});

t.test('the write path: a user message chunk is redacted across chunks too', async (t) => {
  const w = writePath();
  await w.send(chunk('my key sk-live-0123', 'user_message_chunk'), chunk('456789abcdef', 'user_message_chunk'));
  await w.send(turnDone);
  const events = await w.stored();
  t.notOk(JSON.stringify(events).includes('456789abcdef'));
  t.match(blocksOf(events[0] as LogEvent), [{ kind: 'raw', body: 'my key ' }]);
  t.match(blocksOf(events[1] as LogEvent), [{ kind: 'raw', body: REDACTED }]);
});
