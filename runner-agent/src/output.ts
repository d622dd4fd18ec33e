import type { RunnerEvent, RunnerOutput } from '@svc/core';

/** Events per output frame (the protocol allows up to 1000). */
const FRAME_EVENTS = 500;

/**
 * One sandbox incarnation's output, numbered from 1 without holes, kept until the service
 * says the Postgres copy holds it (`durable`). What was sent but not yet acknowledged as
 * appended is sent again after a reconnect or when the service reports a shorter mark; the
 * log drops what it already has, so nothing is lost or doubled.
 */
export class OutputLog {
  private next = 1;
  /** Events not yet durable, oldest first; `pending[0]` has number `base`. */
  private pending: RunnerEvent[] = [];
  private base = 1;
  /** Highest number handed to the connection. */
  private sent = 0;

  constructor(
    readonly sandbox: string,
    readonly incarnation: number,
  ) {}

  /** Numbers an event and keeps it; returns its number. */
  push(event: RunnerEvent): number {
    this.pending.push(event);
    return this.next++;
  }

  /** Frames with everything not yet sent, in order. */
  unsent(): RunnerOutput[] {
    const frames: RunnerOutput[] = [];
    let from = Math.max(this.sent + 1, this.base);
    while (from < this.next) {
      const start = from - this.base;
      const events = this.pending.slice(start, start + FRAME_EVENTS);
      frames.push({ t: 'output', sandbox: this.sandbox, incarnation: this.incarnation, seq: from, events });
      from += events.length;
    }
    this.sent = this.next - 1;
    return frames;
  }

  /** The log holds everything up to `hwm`; anything sent beyond it is sent again. */
  appended(hwm: number): void {
    if (hwm < this.sent) this.sent = Math.max(hwm, this.base - 1);
  }

  /** The copy holds everything up to `seq`: forget it. */
  durable(seq: number): void {
    const drop = Math.min(seq, this.next - 1) - this.base + 1;
    if (drop <= 0) return;
    this.pending.splice(0, drop);
    this.base += drop;
  }

  /** After a reconnect everything still kept is sent again (the service drops what it has). */
  rewind(): void {
    this.sent = this.base - 1;
  }

  /** Events kept, not yet durable. */
  get kept(): number {
    return this.pending.length;
  }
}
