/**
 * Ops the runner scenarios call inside our service's process (lib/ours.ts `call`): make
 * runners (and a sandbox with a conversation for each, so their output is accepted), and time
 * commands the fabric sends and the runners acknowledge.
 */
import { newId } from '@svc/core';
import { conversations, runners, sandboxes } from '@svc/db';
import { RUNNER_TOKEN_PREFIX } from '../../../gateway/src/fabric/presence.ts';
import type { Service } from '../../../gateway/src/main.ts';
import { hashSecret, newSecret } from '../../../gateway/src/secrets/tokens.ts';
import { createConversationRecord } from '../../../gateway/src/services/conversations.ts';
import { Histogram } from '../lib/stats.ts';
import { signUp } from '../tenant.ts';

export interface BenchRunner {
  id: string;
  token: string;
  /** Set when asked for: a sandbox on this runner with one conversation on it. */
  sandbox?: string;
  conversation?: string;
}

/**
 * `count` runners of one bench account, with tokens, made in the database directly (what
 * POST /api/runners does, without its audit row). With `sandboxes`, each gets a runner
 * sandbox (incarnation 0) holding one conversation, as a launch would leave it.
 */
export async function makeRunners(
  svc: Service,
  args: { count: number; sandboxes?: boolean },
): Promise<{ accountId: string; runners: BenchRunner[] }> {
  const { accountId } = await signUp(svc);
  const sql = svc.db.sql;
  const out: BenchRunner[] = [];
  for (let i = 0; i < args.count; i++) {
    const token = newSecret(RUNNER_TOKEN_PREFIX);
    const row = await runners.insertRunner(sql, {
      id: newId('rnr'),
      accountId,
      name: `bench ${i}`,
      tokenHash: hashSecret(token),
      tokenPrefix: token.slice(0, 12),
    });
    const r: BenchRunner = { id: row.id, token };
    if (args.sandboxes) {
      const who = { accountId, actor: 'api' as const, ip: null };
      const conv = await createConversationRecord(sql, who, { agentId: 'agt_bench', title: `ingest ${i}` });
      const sandbox = newId('sbx');
      await sandboxes.insertSandbox(sql, {
        id: sandbox,
        accountId,
        provider: 'runner',
        mode: 'ephemeral',
        runnerId: row.id,
        agentId: 'agt_bench',
        environmentId: null,
        vaultId: null,
      });
      await conversations.setSandbox(sql, accountId, conv.id, sandbox);
      r.sandbox = sandbox;
      r.conversation = conv.id;
    }
    out.push(r);
  }
  return { accountId, runners: out };
}

/** How many of these runners the fabric holds a live (welcomed) connection for. */
export async function liveCount(svc: Service, args: { ids: string[] }): Promise<number> {
  return args.ids.filter((id) => svc.fabric.isLive(id)).length;
}

/**
 * Sends `turn.interrupt` (the smallest command: the runner acknowledges it and, for a turn
 * it does not run, does nothing else) to runners picked at random, `rate` per second for
 * `seconds`, and times each from the send to its acknowledgement. Returns the histogram of
 * the whole run and each second's p50/p99 (by the second the command was sent).
 */
export async function commandRoundTrips(
  svc: Service,
  args: { ids: string[]; rate: number; seconds: number },
): Promise<{
  sent: number;
  failed: number;
  histogram: number[];
  perSecond: { second: number; count: number; p50: number; p99: number }[];
}> {
  // Commands go to runners held now (one that never connected would only time out).
  const ids = args.ids.filter((id) => svc.fabric.isLive(id));
  if (ids.length === 0) throw new Error('no runner is held: nothing to send commands to');
  const whole = new Histogram();
  const seconds: Histogram[] = [];
  let sent = 0;
  let failed = 0;
  const inflight: Promise<void>[] = [];
  const start = performance.now();
  const interval = 1000 / args.rate;
  const end = start + args.seconds * 1000;
  let next = start;
  while (performance.now() < end) {
    const now = performance.now();
    while (next <= now && next < end) {
      const runnerId = ids[Math.floor(Math.random() * ids.length)] as string;
      const second = Math.floor((next - start) / 1000);
      seconds[second] ??= new Histogram();
      const t0 = performance.now();
      sent++;
      inflight.push(
        svc.fabric
          .command(runnerId, {
            kind: 'turn.interrupt',
            sandbox: 'sbx_bench',
            conversation_id: 'cnv_bench',
            turn_id: `trn_${sent}`,
          })
          .then(
            () => {
              const ms = performance.now() - t0;
              whole.record(ms);
              seconds[second]?.record(ms);
            },
            () => {
              failed++;
            },
          ),
      );
      next += interval;
    }
    await new Promise((r) => setTimeout(r, Math.max(1, Math.min(10, next - performance.now()))));
  }
  await Promise.all(inflight);
  return {
    sent,
    failed,
    histogram: whole.toJSON(),
    perSecond: seconds.map((h, second) => ({
      second,
      count: h?.total ?? 0,
      p50: h ? h.percentile(50) : Number.NaN,
      p99: h ? h.percentile(99) : Number.NaN,
    })),
  };
}

/** The service's runner settings, for the report. */
export async function config(svc: Service): Promise<{ RUNNER_HEARTBEAT_MS: number }> {
  return { RUNNER_HEARTBEAT_MS: svc.config.RUNNER_HEARTBEAT_MS };
}
