import { Redis } from 'ioredis';
import t from 'tap';
import { eventLogContract } from '../../gateway/src/log/log.contract.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';

t.test('in-memory event log contract', async (t) => eventLogContract(t, () => memoryEventLog()));

t.test('in memory, an append in the millisecond of a drop still gets an id past the forgotten ones', async (t) => {
  // A clock that stands still: every id comes from `last + 1`, as in a burst within one ms.
  const log = memoryEventLog({ now: () => 1_000_000 });
  const event = { conversationId: 'c1', kind: 'output' as const, stream: 'stdout' as const, data: 'x' };
  const first = await log.append({ tenant: 'acc_a', producer: 'p', seq: 1, events: [event, event, event] });
  const last = first.events.at(-1)?.id as number;
  await log.dropTenant('acc_a');
  const again = await log.append({ tenant: 'acc_a', producer: 'p', seq: 1, events: [event] });
  t.ok((again.events[0]?.id as number) > last, `${again.events[0]?.id} comes after ${last}`);
});

t.test('redis event log contract', { skip: !process.env.TEST_REDIS_URL && 'no TEST_REDIS_URL' }, async (t) => {
  const url = process.env.TEST_REDIS_URL as string;
  const clients: Redis[] = [];
  t.teardown(async () => {
    for (const c of clients) await c.quit();
  });
  const prefix = `logtest${Math.random().toString(36).slice(2, 6)}:`;
  eventLogContract(
    t,
    () => {
      const redis = new Redis(url);
      const sub = new Redis(url);
      clients.push(redis, sub);
      return redisEventLog(redis, sub, { prefix });
    },
    {
      // Losing data: every key of this run is gone, counters and marks included.
      loseData: async () => {
        const r = new Redis(url);
        clients.push(r);
        const keys = await r.keys(`${prefix}*`);
        if (keys.length) await r.del(...keys);
      },
    },
  );
});

t.test('the write path redacts secrets, also split across appends, before anything is stored', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const { REDACTED } = await import('@svc/core');
  const secret = 'sk-live-0123456789abcdef';
  const adapters: [
    string,
    () => Promise<{ log: import('../../gateway/src/log/log.ts').EventLog; raw: () => Promise<string> }>,
  ][] = [
    [
      'memory',
      async () => {
        const log = memoryEventLog();
        return { log, raw: async () => JSON.stringify(await log.read('acme', { after: 0, limit: 100 })) };
      },
    ],
  ];
  if (process.env.TEST_REDIS_URL) {
    const url = process.env.TEST_REDIS_URL;
    adapters.push([
      'redis',
      async () => {
        const redis = new Redis(url);
        const sub = new Redis(url);
        t.teardown(async () => {
          await redis.quit();
          await sub.quit();
        });
        const prefix = `redact${Math.random().toString(36).slice(2, 6)}:`;
        const log = redisEventLog(redis, sub, { prefix });
        return {
          log,
          // Every byte of every key this log wrote.
          raw: async () => {
            const keys = await redis.keys(`${prefix}*`);
            const parts: string[] = [];
            for (const k of keys) {
              const type = await redis.type(k);
              if (type === 'stream') parts.push(JSON.stringify(await redis.xrange(k, '-', '+')));
              else if (type === 'string') parts.push((await redis.get(k)) ?? '');
            }
            return parts.join('\n');
          },
        };
      },
    ]);
  }
  for (const [name, make] of adapters) {
    t.test(name, async (t) => {
      const { log, raw } = await make();
      const redaction = new Redaction();
      await redaction.register('acme', 'c1', [secret, 'short']);
      const appendEvents = createAppender(log, redaction);
      const out = (data: string) => ({ conversationId: 'c1', kind: 'output', stream: 'stdout', data });
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 1, events: [out('export KEY=sk-live-0123')] });
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 2, events: [out('456789abcdef; echo short')] });
      // A resend of the second chunk changes nothing.
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 2, events: [out('456789abcdef; echo short')] });
      await appendEvents({
        tenant: 'acme',
        producer: 'r',
        seq: 3,
        events: [
          {
            conversationId: 'c1',
            kind: 'stage',
            stream: 'stage',
            stage: 'turn',
            state: 'done',
            data: `used ${secret}`,
          },
        ],
      });
      const events = await log.read('acme', { after: 0, limit: 100 });
      const stdout = events
        .filter((e) => e.stream === 'stdout')
        .map((e) => e.data)
        .join('');
      t.equal(stdout, `export KEY=${REDACTED}; echo short`, 'the joined output is whole, the secret replaced');
      t.equal(events.at(-1)?.kind, 'stage', 'held text was released before the stage event');
      t.equal(events.at(-1)?.data, `used ${REDACTED}`);
      const everything = await raw();
      t.notOk(everything.includes(secret), 'the value never reached the store');
      t.notOk(everything.includes('0123456789abcdef'), 'nor its pieces');
    });
  }
});

t.test('values a later turn registers are redacted by the stream redactors made before them', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const log = memoryEventLog();
  const redaction = new Redaction();
  await redaction.register('acme', 'c1', ['svcs_tokenONE_abcdefgh']);
  const appendEvents = createAppender(log, redaction);
  let seq = 0;
  const out = (data: string) =>
    appendEvents({
      tenant: 'acme',
      producer: 'r',
      seq: ++seq,
      events: [{ conversationId: 'c1', kind: 'output', stream: 'stdout', data }],
    });
  await out('first turn; ');
  // The next turn's token, printed three characters a chunk on the same stream.
  await redaction.register('acme', 'c1', ['svcs_tokenTWO_12345678']);
  for (const piece of 'svcs_tokenTWO_12345678 and svcs_tokenONE_abcdefgh.'.match(/.{1,3}/g) ?? []) await out(piece);
  const stdout = (await log.read('acme', { after: 0, limit: 100 })).map((e) => e.data).join('');
  t.equal(stdout, 'first turn; [REDACTED] and [REDACTED].', 'both turns’ tokens, the earlier one still valid');
});

/**
 * A SecretStore in memory, as services/conversation-secrets.ts keeps one in Postgres: values
 * added per conversation, held-back text taken by the load that finds it; `loads` counts
 * loads per conversation. Each load takes a few milliseconds, as a query does.
 */
function memorySecretStore() {
  type HeldText = import('../../gateway/src/log/log.append.ts').HeldText;
  const values = new Map<string, string[]>();
  const held = new Map<string, HeldText>();
  const loads = new Map<string, number>();
  return {
    loads,
    store: {
      load: async (tenant: string, conversationId: string) => {
        loads.set(conversationId, (loads.get(conversationId) ?? 0) + 1);
        await new Promise((r) => setTimeout(r, 2));
        const k = `${tenant}/${conversationId}`;
        const taken = held.get(k);
        held.delete(k);
        return { values: values.get(k) ?? [], held: taken };
      },
      add: async (tenant: string, conversationId: string, more: string[]) => {
        const k = `${tenant}/${conversationId}`;
        values.set(k, [...(values.get(k) ?? []), ...more]);
      },
      saveHeld: async (tenant: string, conversationId: string, h: HeldText) => {
        held.set(`${tenant}/${conversationId}`, h);
      },
    },
  };
}

t.test('a write path that did not register a conversation’s values loads them from the store', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const { store, loads } = memorySecretStore();
  // The launching node registers; another node's write path appends the turn's output.
  await new Redaction(store).register('acme', 'c1', ['sk-live-first-turn-secret']);
  const log = memoryEventLog();
  const appendEvents = createAppender(log, new Redaction(store));
  let seq = 0;
  const out = (turnId: string, data: string) =>
    appendEvents({
      tenant: 'acme',
      producer: 'r',
      seq: ++seq,
      events: [{ conversationId: 'c1', turnId, kind: 'output', stream: 'stdout', data }],
    });
  // Sent without waiting, as frames arrive: each waits for the load, and they keep their order.
  await Promise.all(['sk-l', 'ive-first', '-turn-secret; ', 'ok; '].map((d) => out('trn_1', d)));
  t.equal(loads.get('c1'), 1, 'one load for the turn');
  await new Redaction(store).register('acme', 'c1', ['sk-live-second-turn-secret']);
  await out('trn_1', 'still the first turn; ');
  t.equal(loads.get('c1'), 1, 'a turn already loaded does not load again');
  await out('trn_2', 'sk-live-second-turn-secret.');
  t.equal(loads.get('c1'), 2, 'a new turn loads what its launch added');
  const stdout = (await log.read('acme', { after: 0, limit: 100 })).map((e) => e.data).join('');
  t.equal(stdout, '[REDACTED]; ok; still the first turn; [REDACTED].');
});

t.test('a write path keeps at most 10,000 conversations loaded, never one holding text back', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const { store, loads } = memorySecretStore();
  await store.add('acme', 'held', ['sk-live-held-secret-value']);
  const log = memoryEventLog();
  const redaction = new Redaction(store);
  const appendEvents = createAppender(log, redaction);
  const out = (conversationId: string, seq: number, data: string) =>
    appendEvents({
      tenant: 'acme',
      producer: conversationId,
      seq,
      events: [{ conversationId, kind: 'output', stream: 'stdout', data }],
    });
  await out('held', 1, 'value: sk-live-he');
  await out('quiet', 1, 'nothing secret');
  for (let i = 0; i < 10_000; i++) await out(`c${i}`, 1, 'x');
  await out('quiet', 2, 'again');
  t.equal(loads.get('quiet'), 2, 'the oldest idle conversation was forgotten and loads again');
  await out('held', 2, 'ld-secret-value.');
  t.equal(loads.get('held'), 1, 'the one holding text back was kept');
  const held = (await log.read('acme', { after: 0, limit: 20_000 })).filter((e) => e.conversationId === 'held');
  t.equal(held.map((e) => e.data).join(''), 'value: [REDACTED].', 'and its value is whole, redacted');
});

t.test('text a stopped process held back is taken by the next one, neither lost nor written twice', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const { store, loads } = memorySecretStore();
  const log = memoryEventLog();
  const chunk = (text: string) =>
    JSON.stringify({
      sessionId: 's1',
      update: { sessionUpdate: 'agent_message_chunk', content: { type: 'text', text } },
    });
  // Two events an append, numbered seq and seq + 1.
  const send = (appendEvents: ReturnType<typeof createAppender>, seq: number, stdout: string, acp: string) =>
    appendEvents({
      tenant: 'acme',
      producer: 'r',
      seq,
      events: [
        { conversationId: 'c1', turnId: 'trn_1', kind: 'output', stream: 'stdout', data: stdout },
        { conversationId: 'c1', turnId: 'trn_1', kind: 'output', stream: 'acp', data: chunk(acp) },
      ],
    });
  // The process that launched the turn: both streams end on the start of the credential.
  const first = new Redaction(store);
  await first.register('acme', 'c1', ['sk-ant-credential-123456']);
  await send(createAppender(log, first), 1, 'key sk-an', 'be very s');
  t.equal(await first.saveHeld(), 1, 'it stops holding text of one conversation, and saves it');
  // The next process (another node, or this one restarted) gets the rest of each stream.
  const next = new Redaction(store);
  await send(createAppender(log, next), 3, 't-credential-123456 ok', 'low.');
  t.equal(loads.get('c1'), 2, 'it loaded the values and the held text at once (the first process loaded once too)');
  const events = await log.read('acme', { after: 0, limit: 100 });
  t.equal(
    events
      .filter((e) => e.stream === 'stdout')
      .map((e) => e.data)
      .join(''),
    'key [REDACTED] ok',
    'stdout is whole, the value redacted across the two processes',
  );
  t.equal(
    events
      .filter((e) => e.stream === 'acp')
      .map((e) => JSON.parse(e.data ?? '{}').update.content.text)
      .join(''),
    'be very slow.',
    'the reply is whole: the held "s" came with the next chunk, once',
  );
  await send(createAppender(log, new Redaction(store)), 5, 'x', 'y');
  t.equal(
    (await log.read('acme', { after: 0, limit: 100 }))
      .filter((e) => e.stream === 'stdout')
      .map((e) => e.data)
      .join(''),
    'key [REDACTED] okx',
    'a third process finds nothing held any more',
  );
});

t.test(
  'text a stopped process held back reaches the log once, whatever the runner resends after the restart',
  async (t) => {
    const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
    const chunk = (text: string) =>
      JSON.stringify({
        sessionId: 's1',
        update: { sessionUpdate: 'agent_message_chunk', content: { type: 'text', text } },
      });
    const reply = (seq: number, text: string) => ({
      tenant: 'acme',
      producer: 'sbx',
      seq,
      events: [
        { conversationId: 'c1', turnId: 'trn_1', kind: 'output' as const, stream: 'acp' as const, data: chunk(text) },
      ],
    });
    // The service's own event of the conversation (the reattach stage), from its outbox.
    const reattach = (seq: number) => ({
      tenant: 'acme',
      producer: 'outbox',
      seq,
      events: [
        {
          conversationId: 'c1',
          turnId: 'trn_1',
          kind: 'stage' as const,
          stream: 'stage' as const,
          stage: 'reattach',
          state: 'done',
        },
      ],
    });
    type Input = ReturnType<typeof reply> | ReturnType<typeof reattach>;
    // What reaches the next process before the rest of the reply, in the order it arrives: the
    // runner resends what was not yet durable (the frame that held text back, or one before it,
    // as frames of their own), and the reattach stage may come before or after.
    const cases: [string, Input[]][] = [
      ['nothing resent (all of it was durable)', []],
      ['the frame the held text came from resent', [reply(2, 'be very s')]],
      ['both frames resent, one append each', [reply(1, 'You said: '), reply(2, 'be very s')]],
      ['the reattach stage, then the held frame resent', [reattach(1), reply(2, 'be very s')]],
      ['the reattach stage, then both frames resent', [reattach(1), reply(1, 'You said: '), reply(2, 'be very s')]],
      ['both frames resent, then the reattach stage', [reply(1, 'You said: '), reply(2, 'be very s'), reattach(1)]],
    ];
    for (const [name, resent] of cases) {
      const { store } = memorySecretStore();
      const log = memoryEventLog();
      const first = new Redaction(store);
      await first.register('acme', 'c1', ['sk-ant-credential-123456']);
      const before = createAppender(log, first);
      await before(reply(1, 'You said: '));
      // Ends on an 's' that could start the credential: held back when the process stops.
      await before(reply(2, 'be very s'));
      t.equal(await first.saveHeld(), 1, `${name}: the stopping process saves the held "s"`);
      const after = createAppender(log, new Redaction(store));
      for (const input of resent) await after(input);
      await after(reply(3, 'low.'));
      await after(reply(4, ' tick 0'));
      const text = (await log.read('acme', { after: 0, limit: 100 }))
        .filter((e) => e.stream === 'acp')
        .map((e) => JSON.parse(e.data ?? '{}').update.content.text)
        .join('');
      t.equal(text, 'You said: be very slow. tick 0', `${name}: the reply is whole, once`);
    }
  },
);
