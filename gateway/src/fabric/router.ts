import { ApiError, type RunnerCommandBody } from '@svc/core';

/**
 * How commands reach a runner whose connection another node holds, how durable marks reach
 * the node holding the runner (DESIGN "The life of a prompt", 3: any api node can send to any
 * runner), and how a deleted runner or account is disconnected wherever it is connected.
 * One router per node; the nodes of a deployment share its store (Redis, or for the memory
 * adapter one hub in the process). Without a router, or with a single node, the fabric
 * answers `runner_offline` for a runner it does not hold.
 */
/** Which runner connections a disconnection closes: one runner's, or every runner's of an account. */
export type RunnerSelector = { runnerId: string } | { accountId: string };

export interface RunnerRouter {
  /**
   * Claims the runner for this node (on hello, renewed by its heartbeats). The claim lapses
   * `holdMs` after the last call, so a node that died holds nothing for long. The newest
   * claim wins.
   */
  hold(runnerId: string): void;
  /** Drops this node's claim; a claim another node made since (a takeover) is left alone. */
  release(runnerId: string): void;
  /**
   * Runs the command on the node holding the runner and resolves once that node's `run`
   * resolved (the runner acknowledged it). Rejects with `runner_offline` when no other node
   * holds a live claim (a node never forwards to itself), when the holder does not answer
   * within `timeoutMs`, and when this router closes first; the holder's own failure comes
   * back as relayedError() says.
   */
  forward(runnerId: string, body: RunnerCommandBody): Promise<void>;
  /**
   * Hands these producers' durable marks to every other node's `onDurable` (not this one's).
   * Best effort: a node that misses marks catches up with the next ones, which only go up.
   */
  durable(marks: ReadonlyMap<string, number>): void;
  /**
   * Asks every other node (not this one) to close the runner connections it holds that `who`
   * selects, with this close code and reason, through their `onDisconnect`. Resolves once the
   * request is handed to the store; never rejects (a failure is logged). Best effort: a node
   * that misses it still closes those connections at their next heartbeat, which finds the
   * runner gone.
   */
  disconnect(who: RunnerSelector, code: number, reason: string): Promise<void>;
  /** Stops listening; commands still waiting for an answer reject with `runner_offline`. */
  close(): Promise<void>;
}

/** What every adapter is built with, besides its store. */
export interface RouterNodeOptions {
  /** A claim not renewed for this long lapses (a node that died holds nothing). */
  holdMs: number;
  /** A forwarded command not acknowledged within this long answers `runner_offline`. */
  timeoutMs: number;
  /** Runs a command for a runner this node holds (the fabric's own `commandHere`). */
  run(runnerId: string, body: RunnerCommandBody): Promise<void>;
  /** Marks another node's copier made durable. */
  onDurable(marks: ReadonlyMap<string, number>): void;
  /** Closes the runner connections this node holds that `who` selects (another node deleted them). */
  onDisconnect(who: RunnerSelector, code: number, reason: string): void;
}

/**
 * The error a sender sees when the node holding the runner could not run its command: 503
 * `runner_offline` when that node says the runner is gone (`code` is the holder's ApiError
 * code, `runner_offline` for an error without one), 500 `internal_error` for anything else;
 * the holder's message either way.
 */
export function relayedError(code: string, message: string): ApiError {
  return new ApiError(code === 'runner_offline' ? 'runner_offline' : 'internal_error', message);
}
