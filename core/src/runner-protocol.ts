import { Packr } from 'msgpackr';
import { z } from 'zod';

/**
 * The runner fabric's wire protocol (DESIGN.md "The runner fabric"): binary WebSocket frames,
 * each one msgpack-encoded message whose shape is a schema below, validated on both sides.
 * The runner says which protocol version it speaks in its hello; the service refuses one it
 * does not speak with the close code `unsupported_protocol`.
 */
export const RUNNER_PROTOCOL_VERSION = 1;

/** The path runners connect to (wss://<base>/api/runners/connect). */
export const RUNNER_CONNECT_PATH = '/api/runners/connect';

/**
 * Close codes the service ends a runner connection with (4000-4999 are the application's).
 * The runner-agent prints what each means and whether it will try again.
 */
export const RUNNER_CLOSE = {
  /** A newer connection with the same token took over; this one must not come back. */
  replaced: 4001,
  /** The owner deleted the runner: its token no longer works. */
  revoked: 4002,
  /** A frame that is not a message of this protocol. */
  protocol_error: 4003,
  /** The hello's protocol version is not one the service speaks. */
  unsupported_protocol: 4004,
  /** No hello within the time allowed after connecting. */
  hello_timeout: 4005,
  /** The service is shutting down; reconnect (to another node). */
  going_away: 1001,
} as const;

const SandboxHeld = z.object({ id: z.string().min(1).max(64), incarnation: z.number().int().min(0) });

/** The first message of a connection: who the runner is and what it still holds. */
export const RunnerHello = z.object({
  t: z.literal('hello'),
  protocol: z.number().int().min(1),
  /** The runner-agent's package version. */
  version: z.string().min(1).max(64),
  /** Random per process start: two processes sharing one token are told apart by it. */
  instance: z.string().min(8).max(64),
  hostname: z.string().min(1).max(255),
  /** The directory sandboxes live under (`--root`). */
  root: z.string().min(1).max(4096),
  capabilities: z.array(z.string().max(64)).max(64),
  sandboxes: z.array(SandboxHeld).max(10_000),
});

export const RunnerHeartbeat = z.object({ t: z.literal('heartbeat') });

export const RunnerMessage = z.discriminatedUnion('t', [RunnerHello, RunnerHeartbeat]);
export type RunnerMessage = z.infer<typeof RunnerMessage>;
export type RunnerHello = z.infer<typeof RunnerHello>;

/** The service's answer to a hello: the connection's identity and the heartbeat it expects. */
export const ServiceWelcome = z.object({
  t: z.literal('welcome'),
  runner_id: z.string(),
  /** Increases with every accepted connection of this runner; commands carry it. */
  epoch: z.number().int().min(1),
  heartbeat_ms: z.number().int().min(100),
});

export const ServiceMessage = z.discriminatedUnion('t', [ServiceWelcome]);
export type ServiceMessage = z.infer<typeof ServiceMessage>;

// Plain maps, no records or extensions: a runner of another language can speak this too.
const packr = new Packr({ useRecords: false, moreTypes: false });

export function encodeFrame(message: RunnerMessage | ServiceMessage): Uint8Array {
  return packr.pack(message);
}

/**
 * Decodes and validates one frame against `schema`; undefined when it is not msgpack or not
 * a message of the protocol (the caller closes with `protocol_error`).
 */
export function decodeFrame<S extends z.ZodType>(schema: S, frame: Uint8Array): z.infer<S> | undefined {
  let value: unknown;
  try {
    value = packr.unpack(frame);
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}
