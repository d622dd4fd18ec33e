import { SecretSet, StreamRedactor } from '@svc/core';
import { type AppendInput, type AppendResult, type EventLog, type NewEvent, seqsOf } from './log.ts';

/**
 * ACP `session/update` kinds that carry one text a few tokens at a time. A value the model
 * prints arrives split across several of them, so the text of each kind is redacted as one
 * stream, like stdout.
 */
const TEXT_CHUNK_KINDS = new Set(['agent_message_chunk', 'agent_thought_chunk', 'user_message_chunk']);

/** The params of an ACP text chunk, as the runner sends them in an `acp` event's data. */
interface TextChunk {
  sessionId?: unknown;
  update: { sessionUpdate: string; content: { type: 'text'; text: string } };
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The params of an `acp` event when they are a text chunk, else undefined. */
function textChunkOf(data: string): TextChunk | undefined {
  // Every acp event passes here and most are not chunks: parse only what could be one.
  if (!data.includes('_chunk"')) return undefined;
  let params: unknown;
  try {
    params = JSON.parse(data);
  } catch {
    return undefined;
  }
  const update = isObject(params) ? params.update : undefined;
  if (!isObject(update) || typeof update.sessionUpdate !== 'string') return undefined;
  if (!TEXT_CHUNK_KINDS.has(update.sessionUpdate)) return undefined;
  const content = update.content;
  if (!isObject(content) || content.type !== 'text' || typeof content.text !== 'string') return undefined;
  return params as unknown as TextChunk;
}

/** The chunk with another text, every other field as it was (and in the same order). */
function withText(chunk: TextChunk, text: string): TextChunk {
  return { ...chunk, update: { ...chunk.update, content: { ...chunk.update.content, text } } };
}

/** The text of one ACP chunk kind of a conversation, and the last chunk seen (to release into). */
interface ChunkFeed {
  redactor: StreamRedactor;
  last: TextChunk;
  turnId: string | null;
}

/**
 * The secret values of each conversation's sandbox, registered when the sandbox is built, and
 * the redaction state of each of its output streams and of each ACP text chunk kind. Held by
 * the node whose write path serves the conversation's producer.
 */
export class Redaction {
  private readonly sets = new Map<string, SecretSet>();
  private readonly streams = new Map<string, StreamRedactor>();
  private readonly chunks = new Map<string, ChunkFeed>();

  register(tenant: string, conversationId: string, values: Iterable<string>): void {
    this.sets.set(`${tenant}\0${conversationId}`, new SecretSet(values));
  }

  forget(tenant: string, conversationId: string): void {
    const key = `${tenant}\0${conversationId}`;
    this.sets.delete(key);
    for (const k of this.streams.keys()) if (k.startsWith(`${key}\0`)) this.streams.delete(k);
    for (const k of this.chunks.keys()) if (k.startsWith(`${key}\0`)) this.chunks.delete(k);
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

  /**
   * The data of an ACP text chunk event, its text redacted as part of the text of its kind
   * (the end may be held back for the next chunk of that kind) and every other field redacted
   * whole. A chunk whose text is all held back keeps its place with an empty text, so every
   * event the producer numbered is still appended.
   */
  chunk(tenant: string, conversationId: string, set: SecretSet, chunk: TextChunk, turnId: string | null): string {
    const key = `${tenant}\0${conversationId}\0${chunk.update.sessionUpdate}`;
    let feed = this.chunks.get(key);
    if (!feed) {
      feed = { redactor: new StreamRedactor(set), last: chunk, turnId };
      this.chunks.set(key, feed);
    }
    feed.last = chunk;
    feed.turnId = turnId;
    return set.redact(JSON.stringify(withText(chunk, feed.redactor.push(chunk.update.content.text))));
  }

  /**
   * What the conversation's ACP chunk kinds hold back, redacted and released as chunk events
   * shaped like the last chunk of their kind (same session, same turn), now.
   */
  releaseChunks(tenant: string, conversationId: string, set: SecretSet): NewEvent[] {
    const prefix = `${tenant}\0${conversationId}\0`;
    const out: NewEvent[] = [];
    for (const [k, feed] of this.chunks) {
      if (!k.startsWith(prefix) || !feed.redactor.holding) continue;
      out.push({
        conversationId,
        turnId: feed.turnId,
        kind: 'output',
        stream: 'acp',
        data: set.redact(JSON.stringify(withText(feed.last, feed.redactor.flush()))),
      });
    }
    return out;
  }

  /**
   * What every output stream and ACP chunk kind of the conversation holds back, redacted and
   * released as events, now. Output takes the turn of the event it is released before.
   */
  release(tenant: string, conversationId: string, set: SecretSet, turnId: string | null): NewEvent[] {
    const prefix = `${tenant}\0${conversationId}\0`;
    const out: NewEvent[] = [];
    for (const [k, r] of this.streams) {
      if (!k.startsWith(prefix) || !r.holding) continue;
      out.push({ conversationId, turnId, kind: 'output', stream: k.slice(prefix.length), data: r.flush() });
    }
    out.push(...this.releaseChunks(tenant, conversationId, set));
    return out;
  }
}

/**
 * The single write path of the log (DESIGN.md invariant 2): redacts, then appends.
 *
 * Output chunks (stdout, stderr) go through their stream's redactor, which may hold back the
 * end of a chunk that could be the start of a secret. The text of ACP message, thought and
 * user chunks goes through a redactor per chunk kind the same way, inside the event's JSON,
 * since a model streams a value it prints a few characters per chunk. Each of these texts is
 * read joined by itself (a client joins text blocks, or thinking blocks), so an event of
 * another stream or chunk kind does not release what one holds: stderr comes on a pipe of its
 * own, with no order against the updates.
 *
 * Any other ACP event (a tool call, a permission request) is ordered with the chunks around it,
 * so it first releases what the chunk kinds hold, as chunk events; any other event (a stage,
 * the turn's end) first releases what every stream and chunk kind holds. Released events share
 * the producer number of the event they precede, so held text is never lost, never appended
 * twice, and never overtakes what came before it. Everything else is redacted whole, in the
 * value's plain and JSON-escaped forms.
 *
 * What the producer already delivered (at or below its last known mark) is not redacted
 * again, so a resend does not disturb the redactors; the log drops it as a duplicate.
 */
export type AppendEvents = (input: AppendInput) => Promise<AppendResult>;

export function createAppender(log: EventLog, redaction: Redaction): AppendEvents {
  const marks = new Map<string, number>();

  /** The event as it is appended: redacted, after what its arrival releases. */
  function redacted(tenant: string, e: NewEvent, known: boolean): NewEvent[] {
    const conversationId = e.conversationId;
    // Secrets belong to a conversation's sandbox; a tenant event carries none.
    const set = conversationId === null ? undefined : redaction.setFor(tenant, conversationId);
    if (conversationId === null || !set || set.empty) return [e];
    const whole = typeof e.data === 'string' ? { ...e, data: set.redact(e.data) } : e;
    // Redacted whole, without touching stream state: a store that lost its marks would
    // take it again, and it must not carry a secret then either.
    if (known) return [whole];
    if (e.kind === 'output' && typeof e.data === 'string') {
      if (e.stream !== 'acp') {
        return [{ ...e, data: redaction.streamFor(tenant, conversationId, e.stream, set).push(e.data) }];
      }
      const chunk = textChunkOf(e.data);
      if (chunk) return [{ ...e, data: redaction.chunk(tenant, conversationId, set, chunk, e.turnId ?? null) }];
      return [...redaction.releaseChunks(tenant, conversationId, set), whole];
    }
    return [...redaction.release(tenant, conversationId, set, e.turnId ?? null), whole];
  }

  return async function appendEvents(input: AppendInput): Promise<AppendResult> {
    const markKey = `${input.tenant}\0${input.producer}`;
    const known = marks.get(markKey) ?? Number.NEGATIVE_INFINITY;
    const seqs = seqsOf(input);
    const events: NewEvent[] = [];
    const outSeqs: number[] = [];
    input.events.forEach((e, i) => {
      const seq = seqs[i] as number;
      for (const out of redacted(input.tenant, e, seq <= known)) {
        events.push(out);
        outSeqs.push(seq);
      }
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
