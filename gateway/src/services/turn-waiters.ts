import { TENANT_STREAM } from '@svc/core';
import type { conversations } from '@svc/db';
import type { EventLog, LiveBatch } from '../log/log.ts';

type TurnRow = conversations.TurnRow;

/** What a wait ends with: the turn as recorded, and whether the deadline came first. */
export interface TurnWaitResult {
  /** The turn's record when the wait ended; undefined when no such turn exists. */
  turn: TurnRow | undefined;
  timedOut: boolean;
}

/** The states a `turn` stage event ends a turn with (as the runner and the service report them). */
const TURN_ENDS = new Set(['done', 'failed', 'interrupted', 'timeout']);

interface Waiter {
  accountId: string;
  turnId: string;
  deadline: number;
  resolve: (result: TurnWaitResult) => void;
  settled: boolean;
  /** Its turn was read running and it waits for the end (or its deadline). */
  waiting: boolean;
}

/** One tenant's waiters and its one live feed of the log. */
interface TenantWatch {
  byTurn: Map<string, Set<Waiter>>;
  /** Turns whose end reached the log before their record said so: checked again on the next change. */
  recheck: Set<string>;
  /** Resolves once the feed is live, to the function that ends it. */
  feed: Promise<() => void>;
}

/**
 * Waiters for turns to end, for a whole process (`wait_for_teammate` holds one per call, up to
 * 90 s). A waiter costs a map entry and a heap slot: no thread, no database connection and no
 * timer of its own. Per tenant with waiters there is ONE live subscription to the event log,
 * which watches `turn` stage events that end a turn (turns.ts `turnEndEvent`, or a runner's);
 * per process ONE timer, set for the earliest deadline. A waiter first reads the turn's record
 * (it may have ended already), then waits; when the end event of its turn arrives the record
 * is read once for all the turn's waiters. A record still `running` then (an end the log
 * carried before the record was written) is read again at the tenant's next `conversations`
 * change, which the record's end writes with it.
 */
export class TurnWaiters {
  private readonly tenants = new Map<string, TenantWatch>();
  /** Min-heap of waiters by deadline; settled ones are dropped when they reach the top. */
  private readonly deadlines: Waiter[] = [];
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private waitingCount = 0;

  constructor(
    private readonly deps: {
      log: Pick<EventLog, 'subscribe'>;
      /** The turn's record (one short query; no connection is held between calls). */
      readTurn: (accountId: string, turnId: string) => Promise<TurnRow | undefined>;
    },
  ) {}

  /** How many waiters wait: their turn was read running, and neither its end nor their deadline came. */
  get pending(): number {
    return this.waitingCount;
  }

  /**
   * Resolves when the turn has ended (its record says so), with that record, or after
   * `timeoutMs` with `timedOut: true` and the record as it stands. A turn that ended before
   * the call resolves at once. Never rejects for the wait itself; a failed read of the record
   * rejects.
   */
  async wait(accountId: string, turnId: string, timeoutMs: number): Promise<TurnWaitResult> {
    const watch = this.watch(accountId);
    const waiter: Waiter = {
      accountId,
      turnId,
      deadline: Date.now() + timeoutMs,
      resolve: () => {},
      settled: false,
      waiting: false,
    };
    const result = new Promise<TurnWaitResult>((resolve) => {
      waiter.resolve = resolve;
    });
    let set = watch.byTurn.get(turnId);
    if (!set) {
      set = new Set();
      watch.byTurn.set(turnId, set);
    }
    set.add(waiter);
    try {
      // Registered and subscribed before the record is read: an end that lands between the
      // read and the wait is not missed.
      await watch.feed;
      const turn = await this.deps.readTurn(accountId, turnId);
      if (turn?.state !== 'running') this.settle(waiter, { turn, timedOut: false });
      else this.schedule(waiter);
    } catch (err) {
      this.forget(waiter);
      throw err;
    }
    return result;
  }

  /** Ends every wait at once (timed out) and every feed: the process is stopping. */
  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const watch of this.tenants.values()) {
      for (const set of watch.byTurn.values()) {
        for (const w of set) this.settle(w, { turn: undefined, timedOut: true });
      }
    }
  }

  private watch(accountId: string): TenantWatch {
    const watch = this.tenants.get(accountId);
    if (watch) return watch;
    const created: TenantWatch = { byTurn: new Map(), recheck: new Set(), feed: Promise.resolve(() => {}) };
    created.feed = this.deps.log.subscribe(accountId, (batch) => this.arrived(accountId, created, batch));
    // A feed that failed is forgotten, so the next wait tries again.
    created.feed.catch(() => {
      if (this.tenants.get(accountId) === created) this.tenants.delete(accountId);
    });
    this.tenants.set(accountId, created);
    return created;
  }

  private arrived(accountId: string, watch: TenantWatch, batch: LiveBatch): void {
    let changed = false;
    for (const e of batch.events) {
      if (e.stream === TENANT_STREAM && e.kind === 'conversations') changed = true;
      else if (e.stage === 'turn' && e.turnId && TURN_ENDS.has(e.state ?? '') && watch.byTurn.has(e.turnId)) {
        void this.check(accountId, watch, e.turnId);
      }
    }
    if (changed) for (const turnId of watch.recheck) void this.check(accountId, watch, turnId);
  }

  /** Reads the turn's record once for all its waiters and settles them when it has ended. */
  private async check(accountId: string, watch: TenantWatch, turnId: string): Promise<void> {
    watch.recheck.delete(turnId);
    let turn: TurnRow | undefined;
    try {
      turn = await this.deps.readTurn(accountId, turnId);
    } catch {
      // The database did not answer: try again at the next change (or the deadline comes).
      watch.recheck.add(turnId);
      return;
    }
    const set = watch.byTurn.get(turnId);
    if (!set) return;
    if (turn && turn.state === 'running') {
      watch.recheck.add(turnId);
      return;
    }
    for (const w of [...set]) this.settle(w, { turn, timedOut: false });
  }

  private settle(w: Waiter, result: TurnWaitResult): void {
    if (w.settled) return;
    if (w.waiting) this.waitingCount--;
    w.settled = true;
    this.forget(w);
    // The last waiter gone: the heap holds only settled ones, so the timer goes with them now
    // rather than at their earliest deadline.
    if (this.waitingCount === 0 && this.deadlines.length > 0) {
      this.deadlines.length = 0;
      this.arm();
    }
    w.resolve(result);
  }

  /** Takes the waiter out of its tenant's map; the tenant's feed ends with its last waiter. */
  private forget(w: Waiter): void {
    w.settled = true;
    const watch = this.tenants.get(w.accountId);
    if (!watch) return;
    const set = watch.byTurn.get(w.turnId);
    set?.delete(w);
    if (set && set.size === 0) {
      watch.byTurn.delete(w.turnId);
      watch.recheck.delete(w.turnId);
    }
    if (watch.byTurn.size === 0) {
      this.tenants.delete(w.accountId);
      void watch.feed.then((stop) => stop()).catch(() => {});
    }
  }

  // The deadline heap and its one timer.

  private schedule(w: Waiter): void {
    if (w.settled) return;
    w.waiting = true;
    this.waitingCount++;
    const heap = this.deadlines;
    heap.push(w);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if ((heap[parent] as Waiter).deadline <= w.deadline) break;
      heap[i] = heap[parent] as Waiter;
      i = parent;
    }
    heap[i] = w;
    this.arm();
  }

  private pop(): Waiter | undefined {
    const heap = this.deadlines;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        const at = (k: number) => (k === i ? last : (heap[k] as Waiter));
        if (l < heap.length && (heap[l] as Waiter).deadline < at(m).deadline) m = l;
        if (r < heap.length && (heap[r] as Waiter).deadline < at(m).deadline) m = r;
        if (m === i) break;
        heap[i] = heap[m] as Waiter;
        i = m;
      }
      heap[i] = last;
    }
    return top;
  }

  /** Sets the one timer for the earliest pending deadline (settled waiters are dropped first). */
  private arm(): void {
    while (this.deadlines[0]?.settled) this.pop();
    const next = this.deadlines[0];
    if (!next) {
      clearTimeout(this.timer);
      this.timer = undefined;
      this.timerAt = Number.POSITIVE_INFINITY;
      return;
    }
    if (this.timer && this.timerAt <= next.deadline) return;
    clearTimeout(this.timer);
    this.timerAt = next.deadline;
    this.timer = setTimeout(() => this.expire(), Math.max(0, next.deadline - Date.now()));
  }

  private expire(): void {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    const now = Date.now();
    const due: Waiter[] = [];
    while (this.deadlines[0] && (this.deadlines[0].settled || this.deadlines[0].deadline <= now)) {
      const w = this.pop() as Waiter;
      if (!w.settled) due.push(w);
    }
    this.arm();
    // The record as it stands, read once per turn for all its waiters that are due.
    const byTurn = new Map<string, Waiter[]>();
    for (const w of due) {
      const key = `${w.accountId}\0${w.turnId}`;
      const list = byTurn.get(key);
      if (list) list.push(w);
      else byTurn.set(key, [w]);
    }
    for (const list of byTurn.values()) {
      const first = list[0] as Waiter;
      void this.deps.readTurn(first.accountId, first.turnId).then(
        (turn) => {
          const ended = turn !== undefined && turn.state !== 'running';
          for (const w of list) this.settle(w, { turn, timedOut: !ended });
        },
        () => {
          for (const w of list) this.settle(w, { turn: undefined, timedOut: true });
        },
      );
    }
  }
}
