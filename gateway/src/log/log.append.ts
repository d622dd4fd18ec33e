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
 * Where a conversation's secret values are kept for every node (sealed, in Postgres:
 * services/conversation-secrets.ts).
 */
export interface SecretStore {
  /**
   * Every value registered for the conversation so far (none when nothing was), and what a
   * stopped process's redactors of it held back, taken: the next load finds it no more.
   */
  load(tenant: string, conversationId: string): Promise<{ values: string[]; held?: HeldText | undefined }>;
  /** Adds values to the conversation's stored ones. */
  add(tenant: string, conversationId: string, values: string[]): Promise<void>;
  /** Keeps what the conversation's redactors hold back, for the next load. */
  saveHeld(tenant: string, conversationId: string, held: HeldText): Promise<void>;
}

/**
 * What a conversation's redactors hold back, unredacted: per output stream its text, per ACP
 * chunk kind its text and the chunk (and turn) it is released as; and per producer the last
 * `seq` whose events of the conversation that state already took in (`Conversation#taken`).
 * A held text saved before `taken` was kept has none.
 */
export interface HeldText {
  streams: Record<string, string>;
  chunks: Record<string, { text: string; last: TextChunk; turnId: string | null }>;
  taken?: Record<string, number> | undefined;
}

/**
 * Conversations whose values a node keeps loaded at most (with a store; see Redaction#evict):
 * memory stays bounded however many conversations a long-running node has appended for.
 */
const MAX_CONVERSATIONS = 10_000;

/** A conversation's values and the redaction state of its streams, on this node. */
interface Conversation {
  values: Set<string>;
  set: SecretSet;
  /** Per output stream (stdout, stderr). */
  streams: Map<string, StreamRedactor>;
  /** Per ACP text chunk kind. */
  chunks: Map<string, ChunkFeed>;
  /** With a store: whether its stored values were loaded since this entry was made. */
  loaded: boolean;
  /** Turns whose output may be redacted with the values in memory: loaded since they launched. */
  turns: Set<string>;
  /** A load under way: everything of the conversation waits for it, in the order it came. */
  loading?: Promise<void> | undefined;
  /**
   * Per producer, the last `seq` whose events of the conversation are in the log through these
   * redactors (or through those of the process whose held text was restored here). A resend at
   * or below it is already in the redaction state, held text included: it must neither feed
   * the redactors again nor release what they hold, or that text would reach the log twice (or
   * be replaced and lost) after a restart, when the runner resends what was not yet durable.
   */
  taken: Map<string, number>;
}

const EMPTY = new SecretSet([]);

/**
 * The secret values of each conversation's sandbox, and the redaction state of each of its
 * output streams and of each ACP text chunk kind.
 *
 * A turn's launch registers its values on the launching node and adds them to the store before
 * the runtime starts. The node whose write path appends the turn's output may be another one
 * (it holds the runner; the launch was made elsewhere, or by a process that has stopped since):
 * with a store, the write path first has every value stored for the conversation loaded, once
 * per turn it sees (`ready`). A conversation's values only grow, as do its redactors' sets: a
 * token of an earlier turn is valid until the conversation ends.
 */
export class Redaction {
  private readonly conversations = new Map<string, Conversation>();

  constructor(private readonly store?: SecretStore) {}

  /** The key of a tenant's conversation in `conversations`. */
  private static keyOf(tenant: string, conversationId: string): string {
    return `${tenant}\0${conversationId}`;
  }

  /** The conversation's state, if it has any here. */
  private existing(tenant: string, conversationId: string): Conversation | undefined {
    return this.conversations.get(Redaction.keyOf(tenant, conversationId));
  }

  private entry(tenant: string, conversationId: string): Conversation {
    const key = Redaction.keyOf(tenant, conversationId);
    let c = this.conversations.get(key);
    if (!c) {
      c = {
        values: new Set(),
        set: EMPTY,
        streams: new Map(),
        chunks: new Map(),
        loaded: false,
        turns: new Set(),
        taken: new Map(),
      };
      this.conversations.set(key, c);
      if (this.store && this.conversations.size > MAX_CONVERSATIONS) this.evict();
    }
    return c;
  }

  /** Adds values to the conversation's set here and in the store (awaited before a runtime may print them). */
  async register(tenant: string, conversationId: string, values: Iterable<string>): Promise<void> {
    const list = [...values];
    this.adopt(this.entry(tenant, conversationId), list);
    await this.store?.add(tenant, conversationId, list);
  }

  /**
   * Undefined when the values in memory serve an event of the conversation from `turnId`; else
   * a promise that loads the stored ones first. Calls made while a load is under way get that
   * load, so what waits for it is redacted in the order it came.
   */
  ready(tenant: string, conversationId: string, turnId: string | null): Promise<void> | undefined {
    const { store } = this;
    if (!store) return undefined;
    const c = this.entry(tenant, conversationId);
    if (c.loading) return c.loading;
    if (c.loaded && (turnId === null || c.turns.has(turnId))) return undefined;
    c.loading = store
      .load(tenant, conversationId)
      .then(({ values, held }) => {
        this.adopt(c, values);
        if (held) this.restore(c, held);
        c.loaded = true;
        if (turnId !== null) c.turns.add(turnId);
      })
      .finally(() => {
        c.loading = undefined;
      });
    return c.loading;
  }

  /** The conversation's set once its stored values are loaded (see `ready`). */
  async secretsOf(tenant: string, conversationId: string): Promise<SecretSet | undefined> {
    await this.ready(tenant, conversationId, null);
    return this.setFor(tenant, conversationId);
  }

  /** The values joined into the conversation's set; its redactors redact with the new set from now on. */
  private adopt(c: Conversation, list: string[]): void {
    const before = c.values.size;
    for (const v of list) c.values.add(v);
    if (c.values.size === before) return;
    c.set = new SecretSet(c.values);
    for (const r of c.streams.values()) r.use(c.set);
    for (const f of c.chunks.values()) f.redactor.use(c.set);
  }

  /**
   * Held-back text another process saved: it is held here from now on (in place of what this
   * node held for those streams, which that process's output came after), as the state after
   * the events that process took in.
   */
  private restore(c: Conversation, held: HeldText): void {
    for (const [producer, seq] of Object.entries(held.taken ?? {})) Redaction.take(c, producer, seq);
    for (const [stream, text] of Object.entries(held.streams)) Redaction.streamOf(c, stream).hold(text);
    for (const [kind, h] of Object.entries(held.chunks)) {
      const redactor = new StreamRedactor(c.set);
      redactor.hold(h.text);
      c.chunks.set(kind, { redactor, last: h.last, turnId: h.turnId });
    }
  }

  /** Whether any redactor of the conversation holds text back. */
  private static holding(c: Conversation): boolean {
    for (const r of c.streams.values()) if (r.holding) return true;
    for (const f of c.chunks.values()) if (f.redactor.holding) return true;
    return false;
  }

  /**
   * Saves, for the next process, what every conversation's redactors hold back: called when
   * this one stops, once nothing more is appended through it. Returns how many conversations.
   */
  async saveHeld(): Promise<number> {
    if (!this.store) return 0;
    let saved = 0;
    for (const [key, c] of this.conversations) {
      if (!Redaction.holding(c)) continue;
      const held: HeldText = { streams: {}, chunks: {}, taken: Object.fromEntries(c.taken) };
      for (const [stream, r] of c.streams) if (r.holding) held.streams[stream] = r.heldText;
      for (const [kind, f] of c.chunks) {
        if (f.redactor.holding) held.chunks[kind] = { text: f.redactor.heldText, last: f.last, turnId: f.turnId };
      }
      const [tenant, conversationId] = key.split('\0') as [string, string];
      await this.store.saveHeld(tenant, conversationId, held);
      saved++;
    }
    return saved;
  }

  /**
   * Forgets the conversations loaded longest ago (a tenth of the bound) that hold no text back
   * and load nothing now: their values are in the store, and an event of theirs loads them again.
   */
  private evict(): void {
    let n = Math.ceil(MAX_CONVERSATIONS / 10);
    for (const [key, c] of this.conversations) {
      if (n === 0) break;
      if (c.loading || Redaction.holding(c)) continue;
      this.conversations.delete(key);
      n--;
    }
  }

  /**
   * The last `seq` of the producer whose events of the conversation the redaction state took
   * in (see `Conversation#taken`); -Infinity when none.
   */
  takenUpTo(tenant: string, conversationId: string, producer: string): number {
    return this.existing(tenant, conversationId)?.taken.get(producer) ?? Number.NEGATIVE_INFINITY;
  }

  /** Records that the producer's events of the conversation up to `seq` are in the log, redacted here. */
  taken(tenant: string, conversationId: string, producer: string, seq: number): void {
    const c = this.existing(tenant, conversationId);
    if (c) Redaction.take(c, producer, seq);
  }

  private static take(c: Conversation, producer: string, seq: number): void {
    if (seq > (c.taken.get(producer) ?? Number.NEGATIVE_INFINITY)) c.taken.set(producer, seq);
  }

  forget(tenant: string, conversationId: string): void {
    this.conversations.delete(Redaction.keyOf(tenant, conversationId));
  }

  setFor(tenant: string, conversationId: string): SecretSet | undefined {
    return this.existing(tenant, conversationId)?.set;
  }

  streamFor(tenant: string, conversationId: string, stream: string): StreamRedactor {
    return Redaction.streamOf(this.entry(tenant, conversationId), stream);
  }

  /** The conversation's redactor of an output stream, made on its first use. */
  private static streamOf(c: Conversation, stream: string): StreamRedactor {
    let r = c.streams.get(stream);
    if (!r) {
      r = new StreamRedactor(c.set);
      c.streams.set(stream, r);
    }
    return r;
  }

  /**
   * The data of an ACP text chunk event, its text redacted as part of the text of its kind
   * (the end may be held back for the next chunk of that kind) and every other field redacted
   * whole. A chunk whose text is all held back keeps its place with an empty text, so every
   * event the producer numbered is still appended.
   */
  chunk(tenant: string, conversationId: string, chunk: TextChunk, turnId: string | null): string {
    const c = this.entry(tenant, conversationId);
    const kind = chunk.update.sessionUpdate;
    let feed = c.chunks.get(kind);
    if (!feed) {
      feed = { redactor: new StreamRedactor(c.set), last: chunk, turnId };
      c.chunks.set(kind, feed);
    }
    feed.last = chunk;
    feed.turnId = turnId;
    return c.set.redact(JSON.stringify(withText(chunk, feed.redactor.push(chunk.update.content.text))));
  }

  /**
   * What the conversation's ACP chunk kinds hold back, redacted and released as chunk events
   * shaped like the last chunk of their kind (same session, same turn), now.
   */
  releaseChunks(tenant: string, conversationId: string): NewEvent[] {
    const c = this.existing(tenant, conversationId);
    return c ? Redaction.releaseChunksOf(c, conversationId) : [];
  }

  private static releaseChunksOf(c: Conversation, conversationId: string): NewEvent[] {
    const out: NewEvent[] = [];
    for (const feed of c.chunks.values()) {
      if (!feed.redactor.holding) continue;
      out.push({
        conversationId,
        turnId: feed.turnId,
        kind: 'output',
        stream: 'acp',
        data: c.set.redact(JSON.stringify(withText(feed.last, feed.redactor.flush()))),
      });
    }
    return out;
  }

  /**
   * What every output stream and ACP chunk kind of the conversation holds back, redacted and
   * released as events, now. Output takes the turn of the event it is released before.
   */
  release(tenant: string, conversationId: string, turnId: string | null): NewEvent[] {
    const c = this.existing(tenant, conversationId);
    const out: NewEvent[] = [];
    if (!c) return out;
    for (const [stream, r] of c.streams) {
      if (r.holding) out.push({ conversationId, turnId, kind: 'output', stream, data: r.flush() });
    }
    out.push(...Redaction.releaseChunksOf(c, conversationId));
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
 * What the producer already delivered (at or below its last known mark, or at or below what
 * the conversation's redaction state took in: `Redaction#takenUpTo`, carried across a restart
 * with the held text) is not redacted again, so a resend does not disturb the redactors; the
 * log drops it as a duplicate. So a chunk whose end a stopping process held back reaches the
 * log once, whether the runner resends it to the next process or not: the held text is tied to
 * the `seq` it came from.
 */
export type AppendEvents = (input: AppendInput) => Promise<AppendResult>;

export function createAppender(log: EventLog, redaction: Redaction): AppendEvents {
  const marks = new Map<string, number>();

  /** The event as it is appended: redacted, after what its arrival releases. */
  function redacted(tenant: string, producer: string, e: NewEvent, seq: number, known: number): NewEvent[] {
    const conversationId = e.conversationId;
    // Secrets belong to a conversation's sandbox; a tenant event carries none.
    const set = conversationId === null ? undefined : redaction.setFor(tenant, conversationId);
    if (conversationId === null || !set || set.empty) return [e];
    const whole = typeof e.data === 'string' ? { ...e, data: set.redact(e.data) } : e;
    // Redacted whole, without touching stream state: a store that lost its marks would
    // take it again, and it must not carry a secret then either.
    if (seq <= known || seq <= redaction.takenUpTo(tenant, conversationId, producer)) return [whole];
    if (e.kind === 'output' && typeof e.data === 'string') {
      if (e.stream !== 'acp') {
        return [{ ...e, data: redaction.streamFor(tenant, conversationId, e.stream).push(e.data) }];
      }
      const chunk = textChunkOf(e.data);
      if (chunk) return [{ ...e, data: redaction.chunk(tenant, conversationId, chunk, e.turnId ?? null) }];
      return [...redaction.releaseChunks(tenant, conversationId), whole];
    }
    return [...redaction.release(tenant, conversationId, e.turnId ?? null), whole];
  }

  return async function appendEvents(input: AppendInput): Promise<AppendResult> {
    // The conversation's values are loaded before anything of it is redacted (Redaction#ready).
    for (const e of input.events) {
      if (e.conversationId === null) continue;
      const loading = redaction.ready(input.tenant, e.conversationId, e.turnId ?? null);
      if (loading) await loading;
    }
    const markKey = `${input.tenant}\0${input.producer}`;
    const known = marks.get(markKey) ?? Number.NEGATIVE_INFINITY;
    const seqs = seqsOf(input);
    const events: NewEvent[] = [];
    const outSeqs: number[] = [];
    input.events.forEach((e, i) => {
      const seq = seqs[i] as number;
      for (const out of redacted(input.tenant, input.producer, e, seq, known)) {
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
    // What the log holds now (a `gap` refused the rest): the redaction state took it in.
    input.events.forEach((e, i) => {
      const seq = seqs[i] as number;
      if (e.conversationId !== null && seq <= result.hwm)
        redaction.taken(input.tenant, e.conversationId, input.producer, seq);
    });
    return result;
  };
}
