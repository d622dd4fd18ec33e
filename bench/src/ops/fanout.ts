import type { Service } from '../../../gateway/src/main.ts';
import { createConversationRecord } from '../../../gateway/src/services/conversations.ts';
import { Histogram } from '../lib/stats.ts';
import { signUp } from '../tenant.ts';

/** A conversation the appender writes to, as its own producer (so appends to different conversations never wait for each other). */
interface Target {
  tenant: string;
  conversationId: string;
  producer: string;
  seq: number;
  /**
   * The append under way (and those queued behind it), undefined once it is done: a chain
   * kept from one append to the next (a second later at the issue's rates) would outlive two
   * scavenges, so every link would be promoted and collected by the service's major GC.
   */
  chain: Promise<unknown> | undefined;
}

const targets: Target[] = [];
const now = () => performance.timeOrigin + performance.now();

export interface Layout {
  tenants: { accountId: string; key: string; conversations: string[] }[];
}

/**
 * `tenants` bench accounts with `perTenant` conversations each, and one warm-up event per
 * conversation (a producer's first append loads its mark from Postgres; that is not what the
 * run measures). The warm-up carries no send time, so watchers do not count it.
 */
export async function setup(svc: Service, args: { tenants: number; perTenant: number }): Promise<Layout> {
  const layout: Layout = { tenants: [] };
  for (let t = 0; t < args.tenants; t++) {
    const me = await signUp(svc);
    const conversations: string[] = [];
    for (let c = 0; c < args.perTenant; c++) {
      const conv = await createConversationRecord(
        svc.db.sql,
        { accountId: me.accountId, actor: 'api', ip: null },
        { agentId: 'agt_bench', title: `bench ${c}` },
      );
      conversations.push(conv.id);
      targets.push({
        tenant: me.accountId,
        conversationId: conv.id,
        producer: `bench:${conv.id}`,
        seq: 0,
        chain: undefined,
      });
    }
    layout.tenants.push({ accountId: me.accountId, key: me.key, conversations });
  }
  await Promise.all(targets.map((x) => appendOne(svc, x, 'warm-up')));
  return layout;
}

function appendOne(svc: Service, x: Target, data: string): Promise<unknown> {
  x.seq++;
  return svc.appendEvents({
    tenant: x.tenant,
    producer: x.producer,
    seq: x.seq,
    events: [{ conversationId: x.conversationId, kind: 'output', stream: 'stdout', data }],
  });
}

/**
 * Appends `rate` events a second for `seconds`, round robin over the first `conversations`
 * of `setup` (in the order of its layout), through the service's one write path. Each event's data is `t:<scheduled send time,
 * ms since the epoch>` and `padding` bytes: the scheduled time, so an appender that falls
 * behind shows as latency rather than as a slower rate.
 */
export async function append(
  svc: Service,
  args: { rate: number; seconds: number; padding: number; conversations: number },
): Promise<{
  appended: number;
  failed: number;
  seconds: number;
  issueLag: Record<string, number>;
  appendMs: Record<string, number>;
}> {
  const lag = new Histogram();
  const appendMs = new Histogram();
  const to = targets.slice(0, args.conversations);
  const pad = args.padding > 0 ? ` ${'x'.repeat(args.padding)}` : '';
  const total = Math.round(args.rate * args.seconds);
  const start = now();
  let issued = 0;
  let appended = 0;
  let failed = 0;
  while (issued < total) {
    const due = Math.min(total, Math.floor(((now() - start) * args.rate) / 1000) + 1);
    for (; issued < due; issued++) {
      const x = to[issued % to.length] as Target;
      const sentAt = start + (issued * 1000) / args.rate;
      lag.record(now() - sentAt);
      const send = () => {
        const t0 = now();
        return appendOne(svc, x, `t:${sentAt.toFixed(3)}${pad}`).then(
          (r) => {
            appendMs.record(now() - t0);
            (r as { status: string }).status === 'appended' ? appended++ : failed++;
          },
          () => failed++,
        );
      };
      const p: Promise<unknown> = x.chain ? x.chain.then(send) : send();
      x.chain = p;
      void p.then(() => {
        if (x.chain === p) x.chain = undefined;
      });
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  while (to.some((x) => x.chain)) await Promise.all(to.map((x) => x.chain));
  return {
    appended,
    failed,
    seconds: (now() - start) / 1000,
    issueLag: lag.summary(),
    appendMs: appendMs.summary(),
  };
}
