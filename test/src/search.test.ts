import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newId } from '@svc/core';
import { conversations } from '@svc/db';
import fc from 'fast-check';
import t from 'tap';
import { backfillReplies } from '../../gateway/src/services/reply-backfill.ts';
import { snippetOf } from '../../gateway/src/services/search.ts';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { until } from './until.ts';

interface Hit {
  kind: 'title' | 'prompt' | 'reply';
  conversation_id: string;
  agent_id: string;
  turn_id: string | null;
  turn_number: number | null;
  snippet: string;
  ts: string;
}
interface Page {
  data: Hit[];
  meta: { limit: number; offset: number; has_more: boolean };
}

/**
 * A conversation with ended turns, written through the same queries the service uses (so
 * the search vectors are what the service's own writes make). A turn whose reply is null is
 * left running. Returns the conversation's id and its turns' ids.
 */
async function seed(
  svc: TestService,
  accountId: string,
  c: { agentId: string; title: string; turns?: { prompt: string; reply: string | null }[] },
): Promise<{ id: string; turns: string[] }> {
  const id = newId('cnv');
  await conversations.insertConversation(svc.db.sql, {
    id,
    accountId,
    agentId: c.agentId,
    title: c.title,
    source: 'ui',
  });
  const turns: string[] = [];
  for (const turn of c.turns ?? []) {
    const turnId = newId('trn');
    const started = await conversations.startTurn(svc.db.sql, {
      id: turnId,
      accountId,
      conversationId: id,
      prompt: turn.prompt,
      origin: 'user',
    });
    if (typeof started === 'string') throw new Error(`turn refused: ${started}`);
    if (turn.reply !== null) await conversations.endTurn(svc.db.sql, accountId, turnId, 'done', null, [], turn.reply);
    turns.push(turnId);
  }
  return { id, turns };
}

t.test('a snippet adds nothing to its text but `…` at a cut: whatever the text, markup included', async (t) => {
  const oneSpaced = (s: string) => s.replace(/\s+/g, ' ').trim();
  fc.assert(
    fc.property(
      fc.oneof(
        fc.string({ maxLength: 300 }),
        fc.string({ unit: fc.constantFrom('<b>', '</b>', 'a', ' ', '\n', '&amp;') }),
      ),
      fc.boolean(),
      fc.boolean(),
      (excerpt, cutBefore, cutAfter) => {
        const snippet = snippetOf(excerpt, cutBefore, cutAfter);
        let body = snippet;
        if (cutBefore) body = body.startsWith('…') ? body.slice(1) : 'missing …';
        if (cutAfter) body = body.endsWith('…') ? body.slice(0, -1) : 'missing …';
        return oneSpaced(excerpt).includes(oneSpaced(body)) && !/\s\s/.test(body);
      },
    ),
  );
  t.equal(snippetOf('x <b>y</b>  z', false, false), 'x <b>y</b> z');
});

for (const backend of backends()) {
  t.test(`search (${backend})`, async (t) => {
    const svc = await startTestService(t, { backend, env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND } });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    const search = async (query: string, as = token) => {
      const res = await http.get<Page>(`/api/search?${query}`, { token: as });
      t.equal(res.status, 200, `search ${query}: ${res.text}`);
      return res.body;
    };
    /** `kind:turn number or title` of each hit, in order: what the assertions compare. */
    const found = async (query: string, as = token) =>
      (await search(query, as)).data.map((h) => `${h.kind}:${h.turn_number ?? h.conversation_id}`);
    const sql = svc.db.sql;

    const whales = await seed(svc, me.accountId, {
      agentId: 'agt_whales',
      title: 'Whale watching notes',
      turns: [
        { prompt: 'Where does the blue whale feed?', reply: 'The blue whale feeds on krill in cold water.' },
        { prompt: 'And the orca?', reply: 'Orcas hunt seals; a whale that is blue is rarer.' },
        { prompt: 'Deploying the narwhal tracker', reply: 'Deployed. Deploy again with DEPLOY=1.' },
      ],
    });
    const fish = await seed(svc, me.accountId, {
      agentId: 'agt_fish',
      title: 'Fish tank',
      turns: [{ prompt: 'clean the tank', reply: 'The whale-shark tank is clean.' }],
    });

    t.test('a word finds titles, prompts and replies, each hit saying where it was found', async (t) => {
      const page = await search('q=whale');
      const title = page.data.find((h) => h.kind === 'title');
      t.match(title, {
        kind: 'title',
        conversation_id: whales.id,
        agent_id: 'agt_whales',
        turn_id: null,
        turn_number: null,
        snippet: 'Whale watching notes',
      });
      const [conv] = await sql<{ created_at: Date }[]>`SELECT created_at FROM conversations WHERE id = ${whales.id}`;
      t.equal(title?.ts, conv?.created_at.toISOString(), 'a title hit carries the conversation’s creation time');
      const prompt = page.data.find((h) => h.kind === 'prompt');
      t.match(prompt, {
        conversation_id: whales.id,
        agent_id: 'agt_whales',
        turn_id: whales.turns[0],
        turn_number: 1,
        snippet: 'Where does the blue whale feed?',
      });
      const [turn] = await sql<
        { created_at: Date }[]
      >`SELECT created_at FROM turns WHERE id = ${whales.turns[0] as string}`;
      t.equal(prompt?.ts, turn?.created_at.toISOString(), 'a turn hit carries the turn’s creation time');
      t.same(
        page.data
          .filter((h) => h.kind === 'reply')
          .map((h) => `${h.turn_number}:${h.snippet}`)
          .sort(),
        [
          '1:The blue whale feeds on krill in cold water.',
          '1:The whale-shark tank is clean.',
          '2:Orcas hunt seals; a whale that is blue is rarer.',
        ],
        'every reply that holds the word, "whale-shark" included',
      );
      t.same(page.meta, { limit: 20, offset: 0, has_more: false });
    });

    t.test('matching is on exact tokens in any case, without stemming', async (t) => {
      t.same(await found('q=deploy&kinds=reply'), ['reply:3']);
      t.same(await found('q=DEPLOYED'), ['reply:3']);
      t.same(await found('q=deploying'), ['prompt:3']);
      t.same(await found('q=feed'), ['prompt:1'], '"feeds" in the reply is not "feed"');
      t.same(await found('q=feeds'), ['reply:1']);
      t.same(await found('q=whales'), [], 'no plural of whale');
    });

    t.test('a quoted phrase matches those words in that order only', async (t) => {
      t.same((await found('q="blue whale"')).sort(), ['prompt:1', 'reply:1']);
      t.same(await found('q="whale blue"'), []);
    });

    t.test('a leading minus excludes a word', async (t) => {
      const inWhales = `conversation_id=${whales.id}`;
      t.same(await found(`q=whale -blue&${inWhales}`), [`title:${whales.id}`]);
      t.same(await found(`q=whale -krill&kinds=reply&${inWhales}`), ['reply:2']);
      t.same(await found(`q=whale -"blue whale"&kinds=reply&${inWhales}`), ['reply:2'], 'a phrase can be excluded');
    });

    t.test('`or` finds either word', async (t) => {
      t.same((await found('q=orca or narwhal&kinds=prompt')).sort(), ['prompt:2', 'prompt:3']);
      t.same(await found('q=orca narwhal&kinds=prompt'), [], 'without `or` every word must appear');
    });

    t.test('kinds limits where hits come from', async (t) => {
      t.same(await found('q=whale&kinds=title'), [`title:${whales.id}`]);
      t.same((await found(`q=whale&kinds=prompt,reply&conversation_id=${whales.id}`)).sort(), [
        'prompt:1',
        'reply:1',
        'reply:2',
      ]);
      t.same((await found('q=tank&kinds= reply , title')).sort(), ['reply:1', `title:${fish.id}`]);
    });

    t.test('filters: agent_id, conversation_id, since', async (t) => {
      t.same(await found('q=tank&agent_id=agt_whales'), []);
      t.same((await found('q=tank&agent_id=agt_fish')).sort(), ['prompt:1', 'reply:1', `title:${fish.id}`]);
      t.same(await found(`q=orca&conversation_id=${fish.id}`), []);
      t.same(await found(`q=whale shark&conversation_id=${fish.id}`), ['reply:1'], '"whale-shark" holds both words');
      // The whale conversation is a day older; its turns are as they were.
      await sql`UPDATE conversations SET created_at = now() - interval '1 day' WHERE id = ${whales.id}`;
      await sql`UPDATE turns SET created_at = now() - interval '1 day' WHERE id = ${whales.turns[0] as string}`;
      const since = new Date(Date.now() - 3_600_000).toISOString();
      const inWhales = `conversation_id=${whales.id}`;
      t.same(await found(`q=whale&since=${since}&${inWhales}`), ['reply:2'], 'only what was created since');
      t.same((await found(`q=whale&since=2000-01-01&${inWhales}`)).length, 4, 'a date alone is midnight UTC');
    });

    t.test('hits are ranked, then newest first among equals', async (t) => {
      const ranked = await seed(svc, me.accountId, {
        agentId: 'agt_rank',
        title: 'ranking',
        turns: [
          { prompt: 'gannet', reply: 'one' },
          { prompt: 'gannet gannet gannet, a gannet', reply: 'two' },
          { prompt: 'a gannet', reply: 'three' },
          { prompt: 'the gannet', reply: 'four' },
        ],
      });
      // The densest prompt is the oldest; the two equal ones differ in age.
      const at = (n: number, minutes: number) =>
        sql`UPDATE turns SET created_at = now() - make_interval(mins => ${minutes}) WHERE id = ${ranked.turns[n] as string}`;
      await at(1, 60);
      await at(2, 30);
      await at(3, 10);
      await at(0, 5);
      const order = (await search('q=gannet&kinds=prompt')).data.map((h) => h.turn_number);
      t.equal(order[0], 2, 'the prompt saying it four times ranks first, though it is the oldest');
      t.same(order.slice(1), [1, 4, 3], 'prompts saying it once rank equal: the newest first');
    });

    t.test('paging: limit, offset and has_more walk every hit once', async (t) => {
      const hits = await seed(svc, me.accountId, {
        agentId: 'agt_pages',
        title: 'pelican',
        turns: Array.from({ length: 4 }, (_, i) => ({ prompt: `pelican ${i}`, reply: `pelican reply ${i}` })),
      });
      const all = (await search('q=pelican&limit=100')).data;
      t.equal(all.length, 9, 'one title, four prompts, four replies');
      const walked: Hit[] = [];
      const metas: Page['meta'][] = [];
      for (let offset = 0; ; offset += 4) {
        const page = await search(`q=pelican&limit=4&offset=${offset}`);
        walked.push(...page.data);
        metas.push(page.meta);
        if (!page.meta.has_more) break;
      }
      t.same(metas, [
        { limit: 4, offset: 0, has_more: true },
        { limit: 4, offset: 4, has_more: true },
        { limit: 4, offset: 8, has_more: false },
      ]);
      t.same(walked, all, 'the pages, one after another, are the whole list in its order');
      t.same((await search('q=pelican&limit=4&offset=9')).data, [], 'past the end: empty');
      t.ok(
        all.every((h) => h.conversation_id === hits.id),
        'every hit is of that conversation',
      );
    });

    t.test('snippets are plain text: no markup added, and the text’s own markup is returned as text', async (t) => {
      const html = await seed(svc, me.accountId, {
        agentId: 'agt_html',
        title: 'markup',
        turns: [
          {
            prompt: 'plain heron words',
            reply: 'The <i>heron</i> said <b>"hi"</b> &lt;b&gt; <script>alert(1)</script>.',
          },
        ],
      });
      const [prompt] = (await search(`q=heron&kinds=prompt&conversation_id=${html.id}`)).data;
      t.equal(prompt?.snippet, 'plain heron words', 'the matched word is not wrapped in anything');
      const [reply] = (await search(`q=heron&kinds=reply&conversation_id=${html.id}`)).data;
      t.equal(
        reply?.snippet,
        'The <i>heron</i> said <b>"hi"</b> &lt;b&gt; <script>alert(1)</script>.',
        'markup in the text comes back as the same characters, neither stripped nor decoded',
      );
      t.same(await found(`q=hi&kinds=reply&conversation_id=${html.id}`), ['reply:1'], 'words between tags match');
    });

    t.test('a long text gives a snippet around the match, cut at words, marked with …', async (t) => {
      const filler = (word: string, n: number) => Array.from({ length: n }, () => word).join(' ');
      const long = `${filler('alpha', 200)}\n\nthe cormorant dives\n${filler('omega', 200)}`;
      const c = await seed(svc, me.accountId, {
        agentId: 'agt_long',
        title: 'long',
        turns: [{ prompt: long, reply: '' }],
      });
      const [hit] = (await search(`q=cormorant&conversation_id=${c.id}`)).data;
      const snippet = hit?.snippet ?? '';
      t.match(snippet, /^…alpha( alpha)* the cormorant dives omega( omega)*…$/, snippet);
      t.ok(snippet.length <= 250, `a snippet is short (${snippet.length} characters)`);
    });

    t.test('every source is scoped to the tenant', async (t) => {
      const theirs = await seed(svc, other.accountId, {
        agentId: 'agt_theirs',
        title: 'whale of theirs',
        turns: [{ prompt: 'whale prompt of theirs', reply: 'whale reply of theirs' }],
      });
      const mine = (await search('q=whale&limit=100')).data;
      t.notOk(
        mine.some((h) => h.conversation_id === theirs.id),
        'another tenant’s title, prompt and reply never match',
      );
      t.same(
        (await search('q=whale&limit=100', other.key)).data.map((h) => `${h.kind}:${h.conversation_id}`).sort(),
        [`prompt:${theirs.id}`, `reply:${theirs.id}`, `title:${theirs.id}`],
        'and they see only their own',
      );
      t.same(await found(`q=whale&conversation_id=${whales.id}`, other.key), [], 'even naming my conversation');
    });

    t.test('a running turn is found by its prompt, not by its reply', async (t) => {
      const running = await seed(svc, me.accountId, {
        agentId: 'agt_run',
        title: 'running',
        turns: [{ prompt: 'puffin question', reply: null }],
      });
      // A reply present on a running row (it should not be) is still not searchable.
      await sql`UPDATE turns SET reply = 'puffin answer so far' WHERE id = ${running.turns[0] as string}`;
      t.same(await found(`q=puffin&conversation_id=${running.id}`), ['prompt:1']);
    });

    t.test('bad input is 400 invalid_request with a message saying what is wrong', async (t) => {
      const bad = async (query: string, message: RegExp) => {
        const res = await http.get(`/api/search${query}`, { token });
        t.equal(res.status, 400, `${query}: ${res.text}`);
        t.equal(res.body.error, 'invalid_request', query);
        t.match(res.body.message, message, query);
      };
      await bad('', /\bq\b.*required/);
      await bad('?q=', /\bq\b must hold the words/);
      await bad('?q=%20%20', /\bq\b must hold the words/);
      await bad('?q=-draft', /at least one word to find/);
      await bad('?q=whale&kinds=title,body', /kinds must be a comma list of title, prompt, reply/);
      await bad('?q=whale&since=yesterday', /since must be an ISO 8601 timestamp/);
      await bad('?q=whale&since=2026-13-45', /since must be an ISO 8601 timestamp/);
      await bad('?q=whale&limit=101', /limit/);
      await bad('?q=whale&limit=0', /limit/);
      await bad('?q=whale&offset=-1', /offset/);
      t.same(
        await search('q=%22%22%20!!'),
        { data: [], meta: { limit: 20, offset: 0, has_more: false } },
        'no words: no hits',
      );
      const anonymous = await http.get('/api/search?q=whale');
      t.equal(anonymous.status, 401);
      t.equal(anonymous.body.error, 'unauthorized');
    });

    /** The conversation the real turn ran in, and that turn. */
    let real: { id: string; turnId: string } | undefined;

    t.test('any q at all is answered 200 or 400, never a server error', async (t) => {
      const unit = fc.oneof(
        fc.constantFrom(
          '"',
          "'",
          '-',
          '\\',
          '(',
          ')',
          '|',
          '&',
          '!',
          ':',
          '*',
          '<',
          '>',
          ' ',
          'or',
          'OR',
          '.',
          '$',
          '^',
        ),
        fc.constantFrom('whale', 'blue', 'é', 'ß', 'Ω', '😀', '\u00a0', '\t', '[', ']', '{', '}', '?', '+', '%', '_'),
      );
      await fc.assert(
        fc.asyncProperty(fc.string({ unit, maxLength: 12 }), async (q) => {
          const res = await http.get(`/api/search?q=${encodeURIComponent(q)}`, { token });
          if (res.status === 400) return res.body.error === 'invalid_request';
          return res.status === 200 && Array.isArray(res.body.data);
        }),
        { numRuns: 150 },
      );
      t.pass('150 generated queries answered');
    });

    t.test('a real turn is found by its reply once it has ended', async (t) => {
      const { agent } = await claudeAgent(t, http, token);
      const started = await http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, prompt: 'slow walrus' },
      });
      t.equal(started.status, 201, started.text);
      const id = started.body.id as string;
      const turnsOf = async () =>
        (await http.get(`/api/conversations/${id}/turns`, { token })).body.data as { id: string; state: string }[];
      // "slow" keeps the turn running for seconds, its reply already streaming into the log.
      const whileRunning = await found(`q=said&conversation_id=${id}`);
      const stillRunning = (await turnsOf())[0]?.state === 'running';
      t.ok(stillRunning, 'the turn was still running when searched');
      t.same(whileRunning, [], 'a running turn’s reply is not searchable');
      t.same(await found(`q=walrus&kinds=prompt&conversation_id=${id}`), ['prompt:1'], 'its prompt is');
      await until('the turn to end', async () => (await turnsOf())[0]?.state === 'done', 60_000);
      const [hit] = (await search(`q=said&conversation_id=${id}`)).data;
      const [turn] = await turnsOf();
      t.match(hit, { kind: 'reply', turn_id: turn?.id, turn_number: 1, agent_id: agent.id });
      t.match(hit?.snippet, /^You said: slow walrus\./);
      real = { id, turnId: turn?.id as string };
    });

    t.test('a turn that ended before replies were stored is found by its reply once the backfill ran', async (t) => {
      if (!real) return t.fail('needs the real turn of the test before');
      const { id, turnId } = real;
      const [stored] = await sql<{ reply: string }[]>`SELECT reply FROM turns WHERE id = ${turnId}`;
      // The row as such a turn has it: no reply, and an end before replies were stored (013).
      await sql`UPDATE turns SET reply = NULL,
                  ended_at = (SELECT applied_at - interval '1 day' FROM schema_migrations WHERE name = '013_turn_reply.sql')
                WHERE id = ${turnId}`;
      // A turn that failed before it ran, after replies were stored, has none either: not the backfill's.
      const failed = await seed(svc, me.accountId, { agentId: 'agt_failed', title: 'failed', turns: [] });
      const failedTurn = newId('trn');
      await conversations.startTurn(sql, {
        id: failedTurn,
        accountId: me.accountId,
        conversationId: failed.id,
        prompt: 'never ran',
        origin: 'user',
      });
      await conversations.endTurn(sql, me.accountId, failedTurn, 'failed', null);
      t.same(await found(`q=said&conversation_id=${id}`), [], 'before the backfill: found by prompt only');

      t.equal(await backfillReplies({ sql, log: svc.eventLog }), 1, 'one turn filled');
      const [hit] = (await search(`q=said&conversation_id=${id}`)).data;
      t.match(hit, { kind: 'reply', turn_id: turnId, turn_number: 1 });
      const [after] = await sql<{ reply: string }[]>`SELECT reply FROM turns WHERE id = ${turnId}`;
      t.equal(after?.reply, stored?.reply, 'the same reply as the turn’s end stored');
      t.equal(await backfillReplies({ sql, log: svc.eventLog }), 0, 'a second run finds nothing to do');
      const [untouched] = await sql<{ reply: string | null }[]>`SELECT reply FROM turns WHERE id = ${failedTurn}`;
      t.equal(untouched?.reply, null, 'a turn that ended after replies were stored is left alone');
    });

    t.test('the migration can run again without harm', async (t) => {
      const text = await readFile(new URL('../../db/migrations/022_search.sql', import.meta.url), 'utf8');
      await sql.unsafe(text);
      t.same(await found(`q=whale&kinds=title&conversation_id=${whales.id}`), [`title:${whales.id}`]);
    });
  });
}

for (const backend of backends()) {
  t.test(`search counts against the rate limit like all of /api (${backend})`, async (t) => {
    // Burst 5: the harness reads /api/openapi.json once at start, leaving 4.
    const svc = await startTestService(t, { backend, env: { RATE_LIMIT_PER_MINUTE: '5' } });
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await fetch(`${svc.url}/api/search?q=whale`)).status);
    t.same(statuses, [401, 401, 401, 401], 'the burst passes');
    const limited = await fetch(`${svc.url}/api/search?q=whale`);
    t.equal(limited.status, 429);
    t.ok(Number(limited.headers.get('retry-after')) >= 1, `Retry-After: ${limited.headers.get('retry-after')}`);
    t.same(await limited.json(), { error: 'rate_limited', message: 'Too many requests; retry later.' });
  });
}

t.test('the embedded database on disk keeps its search indexes across a restart', async (t) => {
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-search-disk-'));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  const env = { DATABASE_URL: '', DATA_DIR: dataDir };
  const first = await startTestService(t, { backend: 'embedded', env });
  const me = await signUp(first);
  const c = await seed(first, me.accountId, {
    agentId: 'agt_disk',
    title: 'kestrel',
    turns: [{ prompt: 'kestrel prompt', reply: 'kestrel reply' }],
  });
  await first.close();
  const second = await startTestService(t, { backend: 'embedded', env });
  const res = await second.http.get<Page>('/api/search?q=kestrel', { token: me.key });
  t.equal(res.status, 200, res.text);
  t.same(res.body.data.map((h) => `${h.kind}:${h.conversation_id}`).sort(), [
    `prompt:${c.id}`,
    `reply:${c.id}`,
    `title:${c.id}`,
  ]);
});
