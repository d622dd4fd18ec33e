import { SecretSet, StreamRedactor } from '@svc/core';
import { type AppendInput, type AppendResult, type EventLog, type NewEvent, seqsOf } from './log.ts';

/**
 * The secret values of each conversation's sandbox, registered when the sandbox is built, and
 * the redaction state of each of its output streams. Held by the node whose write path serves
 * the conversation's producer.
 */
export class Redaction {
  private readonly sets = new Map<string, SecretSet>();
  private readonly streams = new Map<string, StreamRedactor>();

  register(tenant: string, conversationId: string, values: Iterable<string>): void {
    this.sets.set(`${tenant}\0${conversationId}`, new SecretSet(values));
  }

  forget(tenant: string, conversationId: string): void {
    const key = `${tenant}\0${conversationId}`;
    this.sets.delete(key);
    for (const k of this.streams.keys()) if (k.startsWith(`${key}\0`)) this.streams.delete(k);
  }

  setFor(tenant: string, conversationId: string): SecretSet | undefined {
    return this.sets.get(`${tenant}\0${conversationId}`);
  }

  streamFor(tenant: string, conversationId: string, stream: string, set: SecretSet): StreamRedactor {
    const key = `${tenant}\0${conversationId}\0${stream}`;
    let r = this.streams.get(key);
    if (!r) {
      r = new StreamRedactor(set);
      this.streams.set(key, r);
    }
    return r;
  }

  /** Streams of the conversation that hold back text, with that text (redacted), now released. */
  flush(tenant: string, conversationId: string): { stream: string; data: string }[] {
    const prefix = `${tenant}\0${conversationId}\0`;
    const out: { stream: string; data: string }[] = [];
    for (const [k, r] of this.streams) {
      if (k.startsWith(prefix) && r.holding) out.push({ stream: k.slice(prefix.length), data: r.flush() });
    }
    return out;
  }
}

/**
 * The single write path of the log (DESIGN.md invariant 2): redacts, then appends. Output
 * chunks go through their stream's redactor, which may hold back the end of a chunk that
 * could be the start of a secret; any other event first releases what its conversation's
 * streams hold, as output events sharing that event's producer number, so held text is never
 * lost and never overtakes what came before it. Other events' text is redacted whole.
 *
 * What the producer already delivered (at or below its last known mark) is not redacted
 * again, so a resend does not disturb the redactors; the log drops it as a duplicate.
 */
export type AppendEvents = (input: AppendInput) => Promise<AppendResult>;

export function createAppender(log: EventLog, redaction: Redaction): AppendEvents {
  const marks = new Map<string, number>();
  return async function appendEvents(input: AppendInput): Promise<AppendResult> {
    const markKey = `${input.tenant}\0${input.producer}`;
    const known = marks.get(markKey) ?? Number.NEGATIVE_INFINITY;
    const seqs = seqsOf(input);
    const events: NewEvent[] = [];
    const outSeqs: number[] = [];
    input.events.forEach((e, i) => {
      const seq = seqs[i] as number;
      const conversationId = e.conversationId;
      // Secrets belong to a conversation's sandbox; a tenant event carries none.
      const set = conversationId === null ? undefined : redaction.setFor(input.tenant, conversationId);
      if (conversationId === null || !set || set.empty) {
        events.push(e);
        outSeqs.push(seq);
        return;
      }
      if (seq <= known) {
        // Redacted whole, without touching stream state: a store that lost its marks would
        // take it again, and it must not carry a secret then either.
        events.push(typeof e.data === 'string' ? { ...e, data: set.redact(e.data) } : e);
        outSeqs.push(seq);
        return;
      }
      if (e.kind === 'output' && typeof e.data === 'string') {
        const data = redaction.streamFor(input.tenant, conversationId, e.stream, set).push(e.data);
        events.push({ ...e, data });
        outSeqs.push(seq);
        return;
      }
      for (const held of redaction.flush(input.tenant, conversationId)) {
        events.push({
          conversationId,
          turnId: e.turnId ?? null,
          kind: 'output',
          stream: held.stream,
          data: held.data,
        });
        outSeqs.push(seq);
      }
      events.push(typeof e.data === 'string' ? { ...e, data: set.redact(e.data) } : e);
      outSeqs.push(seq);
    });
    const result = await log.append({
      tenant: input.tenant,
      producer: input.producer,
      seq: input.seq,
      events,
      seqs: outSeqs,
    });
    marks.set(markKey, result.hwm);
    return result;
  };
}
