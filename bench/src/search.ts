/**
 * Search on a big tenant: fills one tenant with 100,000 ended turns (prompts and replies of
 * made-up words with a skewed, Zipf-like frequency, so some words are in nearly every text
 * and most are rare) across 1,000 conversations, and four other tenants with 25,000 turns
 * each, on a throwaway PostgreSQL. Then, for a handful of queries from a rare word to the
 * most common one, it times `GET /api/search` end to end (median of several runs) and prints
 * the `EXPLAIN ANALYZE` of the very query the service runs (db's `searchHits`, through
 * auto_explain, so no SQL is restated here).
 *
 *   npm run bench:search -- [--turns 100000] [--runs 5] [--smoke] [--out DIR]
 *
 * Writes bench/reports/search-<time>.{json,md} (or into --out). --smoke: 1,000 turns, one run.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { search } from '@svc/db';
import postgres from 'postgres';
import { loadConfig } from '../../gateway/src/config.ts';
import { createLogger, startService } from '../../gateway/src/main.ts';
import { startPostgres } from './lib/postgres.ts';
import { signUp } from './tenant.ts';

const { values } = parseArgs({
  options: {
    turns: { type: 'string' },
    runs: { type: 'string' },
    smoke: { type: 'boolean', default: false },
    out: { type: 'string' },
  },
});
// --smoke: a small tenant and one run, only proving the script produces its report (npm test).
const turns = Number(values.turns ?? (values.smoke ? '1000' : '100000'));
const runs = Number(values.runs ?? (values.smoke ? '1' : '5'));
const TURNS_PER_CONVERSATION = 100;
const OTHER_TENANTS = 4;
const say = (s: string) => process.stdout.write(`${s}\n`);

/**
 * The vocabulary, most frequent first: a few real words, then made-up syllable words. A text
 * picks word i with probability falling like a cube: `the` is in nearly every reply.
 */
function vocabulary(size: number): string[] {
  const common = ['the', 'a', 'to', 'and', 'of', 'in', 'is', 'it', 'that', 'for', 'file', 'test', 'build', 'error'];
  const syllables = ['ka', 'lo', 'mi', 'ne', 'ru', 'so', 'ti', 'va', 'xe', 'zu', 'be', 'do', 'fi', 'go', 'hu'];
  const words = [...common];
  for (let i = 0; words.length < size; i++) {
    const a = syllables[i % 15] as string;
    const b = syllables[Math.floor(i / 15) % 15] as string;
    const c = syllables[Math.floor(i / 225) % 15] as string;
    words.push(`${a}${b}${c}`);
  }
  return words;
}
const vocab = vocabulary(5000);

const pg = await startPostgres(say);
try {
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-bench-search-'));
  const config = loadConfig({
    PORT: '0',
    DATABASE_URL: pg.url,
    DATA_DIR: dataDir,
    RATE_LIMIT_PER_MINUTE: '0',
    LOG_LEVEL: 'warn',
    MASTER_KEY: randomBytes(32).toString('hex'),
  });
  const svc = await startService(config, createLogger('warn'));
  const sql = svc.db.sql;

  /**
   * Fills a tenant with `n` ended turns, TURNS_PER_CONVERSATION to a conversation, a minute
   * apart; `needles` of its replies also say "needle in the haystack". Bulk SQL: the bench
   * measures reading, and one insert per turn would take longer than the whole measurement.
   */
  async function fill(accountId: string, tag: string, n: number, needles: number): Promise<void> {
    const conversations = Math.ceil(n / TURNS_PER_CONVERSATION);
    // A correlated subquery (the `+ 0 * row` term) is evaluated per row, so every text differs.
    const words = (count: number, row: postgres.PendingQuery<postgres.Row[]>) => sql`
      (SELECT string_agg((${vocab}::text[])[1 + floor(power(random(), 3) * ${vocab.length})::int], ' ')
       FROM generate_series(1, ${count} + 0 * ${row}))`;
    await sql`SELECT setseed(0.42)`;
    await sql`
      INSERT INTO conversations (id, account_id, agent_id, title, created_at)
      SELECT ${`cnv_${tag}_`} || lpad(c::text, 7, '0'), ${accountId}, ${`agt_${tag}_`} || (c % 10),
             ${words(4, sql`c`)}, now() - make_interval(mins => (${n} - (c - 1) * ${TURNS_PER_CONVERSATION})::int)
      FROM generate_series(1, ${conversations}) c`;
    await sql`
      INSERT INTO turns (id, account_id, conversation_id, number, prompt, state, reply, created_at, ended_at)
      SELECT ${`trn_${tag}_`} || lpad(i::text, 8, '0'), ${accountId},
             ${`cnv_${tag}_`} || lpad(((i - 1) / ${TURNS_PER_CONVERSATION} + 1)::text, 7, '0'),
             (i - 1) % ${TURNS_PER_CONVERSATION} + 1,
             ${words(12, sql`i`)}, 'done',
             ${words(80, sql`i`)} || CASE WHEN i % ${Math.max(1, Math.floor(n / Math.max(needles, 1)))} = 0 AND ${needles} > 0
                                          THEN ' a needle in the haystack' ELSE '' END,
             now() - make_interval(mins => (${n} - i)::int), now() - make_interval(mins => (${n} - i)::int)
      FROM generate_series(1, ${n}) i`;
  }

  const started = performance.now();
  const me = await signUp(svc);
  say(`filling one tenant with ${turns} turns and ${OTHER_TENANTS} others with ${turns / 4} each...`);
  await fill(me.accountId, 'me', turns, 20);
  for (let i = 0; i < OTHER_TENANTS; i++) {
    const other = await signUp(svc);
    await fill(other.accountId, `o${i}`, Math.floor(turns / 4), 20);
  }
  await sql`VACUUM ANALYZE turns`;
  await sql`VACUUM ANALYZE conversations`;
  const fillSeconds = (performance.now() - started) / 1000;
  const [sizes] = await sql<
    { turns: string; tenant_turns: string; table: string; prompt_idx: string; reply_idx: string }[]
  >`
    SELECT (SELECT count(*) FROM turns)::text AS turns,
           (SELECT count(*) FROM turns WHERE account_id = ${me.accountId})::text AS tenant_turns,
           pg_size_pretty(pg_total_relation_size('turns')) AS table,
           pg_size_pretty(pg_relation_size('turns_prompt_search_idx')) AS prompt_idx,
           pg_size_pretty(pg_relation_size('turns_reply_search_idx')) AS reply_idx`;
  say(`filled in ${fillSeconds.toFixed(0)} s: ${JSON.stringify(sizes)}`);

  const mid = vocab[400] as string;
  const other = vocab[900] as string;
  const queries: { label: string; query: string }[] = [
    { label: 'rare word (20 replies)', query: 'q=needle' },
    { label: 'phrase', query: 'q="needle in the haystack"' },
    { label: `mid-frequency word (${mid})`, query: `q=${mid}` },
    { label: 'or', query: `q=needle or ${mid}` },
    { label: 'exclusion', query: `q=${mid} -${other}` },
    { label: 'mid word, one agent, replies only', query: `q=${mid}&agent_id=agt_me_3&kinds=reply` },
    { label: 'mid word, one conversation', query: `q=${mid}&conversation_id=cnv_me_0000500` },
    { label: 'most common word (the)', query: 'q=the' },
    { label: 'most common word, page 50', query: 'q=the&offset=1000' },
  ];

  // A connection of our own with auto_explain, to show the plan of the query the service runs.
  const explainer = postgres(pg.url, { max: 1, onnotice: (n) => plans.push(String(n.message ?? '')) });
  let plans: string[] = [];
  await explainer`LOAD 'auto_explain'`;
  await explainer`SET auto_explain.log_min_duration = 0`;
  await explainer`SET auto_explain.log_analyze = on`;
  await explainer`SET auto_explain.log_buffers = on`;
  await explainer`SET auto_explain.log_level = notice`;
  await explainer`SET client_min_messages = notice`;

  interface Row {
    label: string;
    query: string;
    hits: number;
    hasMore: boolean;
    medianMs: number;
    minMs: number;
    plan: string;
  }
  const rows: Row[] = [];
  let queryText = '';
  for (const { label, query } of queries) {
    const times: number[] = [];
    let body: { data: unknown[]; meta: { has_more: boolean } } = { data: [], meta: { has_more: false } };
    for (let i = 0; i < runs; i++) {
      const t0 = performance.now();
      const res = await fetch(`${svc.url}/api/search?${query}`, { headers: { authorization: `Bearer ${me.key}` } });
      body = (await res.json()) as typeof body;
      times.push(performance.now() - t0);
      if (res.status !== 200) throw new Error(`${query}: ${res.status} ${JSON.stringify(body)}`);
    }
    times.sort((a, b) => a - b);
    const params = new URLSearchParams(query);
    const q = params.get('q') as string;
    const parsed = await search.parseQuery(explainer, q);
    plans = [];
    await search.searchHits(explainer, me.accountId, q, parsed.required, {
      kinds: (params.get('kinds')?.split(',') ?? ['title', 'prompt', 'reply']) as search.SearchKind[],
      agentId: params.get('agent_id') ?? undefined,
      conversationId: params.get('conversation_id') ?? undefined,
      limit: 20,
      offset: Number(params.get('offset') ?? 0),
    });
    // auto_explain's notice is the duration, the query's text, then the plan from its first node.
    const notice = plans.at(-1) ?? '';
    const planAt = notice.search(/^\S.*\(cost=/m);
    queryText ||= notice.slice(notice.indexOf('Query Text:'), planAt).trim();
    const plan = planAt >= 0 ? notice.slice(planAt) : notice;
    const row = {
      label,
      query,
      hits: body.data.length,
      hasMore: body.meta.has_more,
      medianMs: Number((times[Math.floor(times.length / 2)] ?? 0).toFixed(1)),
      minMs: Number((times[0] ?? 0).toFixed(1)),
      plan,
    };
    rows.push(row);
    say(`\n## ${label}: GET /api/search?${query}  median ${row.medianMs} ms, min ${row.minMs} ms\n${plan}`);
  }
  const [{ server_version: version } = { server_version: '?' }] = await explainer<
    { server_version: string }[]
  >`SHOW server_version`;
  await explainer.end();
  await svc.close();
  const figures = {
    turns,
    otherTenants: { count: OTHER_TENANTS, turnsEach: Math.floor(turns / 4) },
    sizes,
    fillSeconds: Math.round(fillSeconds),
    runs,
    postgres: version,
    machine: { cores: cpus().length, node: process.version },
    command: `npm run bench:search -- ${process.argv.slice(2).join(' ')}`.trim(),
    results: rows,
  };
  const dir = values.out ?? join(fileURLToPath(new URL('.', import.meta.url)), '..', 'reports');
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  writeFileSync(join(dir, `search-${stamp}.json`), `${JSON.stringify(figures, null, 2)}\n`);
  writeFileSync(
    join(dir, `search-${stamp}.md`),
    [
      `# Search on a tenant with ${turns} turns (PostgreSQL ${version})`,
      '',
      `\`${figures.command}\` on ${figures.machine.cores} cores, Node ${figures.machine.node}. The tenant has`,
      `${turns / TURNS_PER_CONVERSATION} conversations; ${OTHER_TENANTS} other tenants hold ${figures.otherTenants.turnsEach} turns each.`,
      `Tables: ${sizes?.turns} turns, ${sizes?.table} with indexes; GIN on prompts ${sizes?.prompt_idx}, on replies ${sizes?.reply_idx}.`,
      '',
      `| query | hits on page 1 | median ms (of ${runs}, end to end over HTTP) |`,
      '|---|---|---|',
      ...rows.map((r) => `| ${r.label}: \`${r.query}\` | ${r.hits}${r.hasMore ? '+' : ''} | ${r.medianMs} |`),
      '',
      "## The query (the first one's text; the others differ only in their filters)",
      '',
      '```sql',
      queryText,
      '```',
      '',
      ...rows.flatMap((r) => [`## ${r.label}`, '', '```', r.plan.trimEnd(), '```', '']),
    ].join('\n'),
  );
  say(`\nwrote ${join(dir, `search-${stamp}`)}.{json,md}`);
} finally {
  await pg.stop();
}
