import type { BrokerBinding, RunnerEvent } from '@svc/core';
import { SandboxBroker, SandboxCa } from './broker.ts';
import { EgressProxy, type OnEgress, type OnRefused } from './egress-proxy.ts';
import { installFirewall } from './firewall.ts';
import { splitHostPort } from './hosts.ts';
import type { Bridges, Isolation } from './isolation.ts';
import type { RunAs } from './run-as.ts';

/** What the `network` stage applied to a sandbox, as its processes need it. */
export interface SandboxEgress {
  /**
   * The proxy variables of a process of `conversationId` on the sandbox (empty when it is
   * unrestricted and nothing goes through the proxy). Each conversation has its own
   * credential, so a refusal is reported to the conversation whose process made it.
   */
  env(conversationId: string, bindings?: readonly BrokerBinding[]): Record<string, string>;
  /** An isolated sandbox's bridges out of its network namespace (see Isolation). */
  bridges?: Bridges;
}

/**
 * The ports of `hosts` on the runner's loopback as a sandbox names it (`127.0.0.1:8080`,
 * `localhost:3000`, `[::1]:80`: the names NO_PROXY sends straight to the sandbox's own
 * loopback, where a bridge then listens). Other 127.x addresses go through the proxy.
 */
export function loopbackPorts(hosts: string[]): number[] {
  const ports = hosts.flatMap((h) => {
    const hp = splitHostPort(h);
    const name = hp?.host.toLowerCase().replace(/^\[|\]$/g, '');
    return hp?.port && (name === 'localhost' || name === '::1' || name === '127.0.0.1') ? [hp.port] : [];
  });
  return [...new Set(ports)];
}

/**
 * Hosts a process reaches without the proxy: loopback is the sandbox's own machine (its test
 * servers, and SVC_API_URL when the service runs there), not egress.
 */
const NO_PROXY = 'localhost,127.0.0.1,::1';

type Emit = (event: RunnerEvent) => void;

/**
 * The runner's egress control (DECISIONS: `networking_config.allowed_hosts` is enforced): one
 * allow-listing proxy for all its sandboxes, started on first use, and, when the runner is
 * root and runs processes as a `--run-as` user, a firewall rule by that user's id that leaves
 * a process ignoring the proxy no route off the machine. The rule is per user, not per
 * sandbox, so with it in place an unrestricted sandbox also goes out through the proxy (with
 * no allowlist): only HTTP(S) leaves then, and its stage says so.
 */
export class RunnerEgress {
  private proxy: Promise<EgressProxy> | undefined;
  private firewall: Promise<string> | undefined;

  constructor(
    readonly runAs: RunAs | null,
    private readonly onRefused: OnRefused,
    private readonly onEgress: OnEgress = () => {},
  ) {}

  /** `uid <n>` when the rule holds, else `none: <why>`; the rule is installed on first call. */
  private firewallState(): Promise<string> {
    if (!this.runAs) {
      return Promise.resolve(
        process.getuid?.() === 0
          ? 'none: no --run-as user (runtimes run as the runner’s own user)'
          : 'none: runner is not root',
      );
    }
    if (process.getuid?.() !== 0) return Promise.resolve('none: runner is not root');
    this.firewall ??= installFirewall(this.runAs.uid);
    return this.firewall;
  }

  private started(): Promise<EgressProxy> {
    this.proxy ??= EgressProxy.start(this.onRefused, this.onEgress);
    return this.proxy;
  }

  /**
   * Runs stage `network` for a sandbox: applies `network` (null: unrestricted) and reports what
   * holds in the stage's data, `{"mode": "proxy" | "unrestricted", "allowed_hosts": [...],
   * "firewall": "network namespace" | "uid <n>" | "none: <why>", "isolation": "namespaces" |
   * "none", "note"}`. An isolated sandbox gets its bridges out of its network namespace here
   * (the proxy, and the loopback ports it always reaches); without isolation the proxy is
   * advisory unless the `--run-as` firewall holds, and the note says which.
   * Fails the stage (and the build) when an allowlist cannot be applied at all.
   */
  async apply(
    spec: {
      id: string;
      incarnation: number;
      conversationId: string;
      network?: { allowed_hosts: string[] } | null;
      reach?: string[] | undefined;
      /** Present when its egress is brokered: its requests then always go through the proxy. */
      broker?: readonly BrokerBinding[] | undefined;
    },
    emit: Emit,
    /** How the sandbox is isolated: with `namespaces`, the proxy is its one way out. */
    isolation?: Isolation,
  ): Promise<SandboxEgress> {
    const { id: sandbox, incarnation, conversationId } = spec;
    const network = spec.network ?? null;
    const base = {
      conversation_id: conversationId,
      kind: 'stage' as const,
      stream: 'stage' as const,
      stage: 'network',
    };
    // A new build (incarnation) of the sandbox: the credentials of the one before end.
    await this.forget(sandbox);
    const startedAt = Date.now();
    const isolated = isolation?.mode === 'namespaces';
    const firewall = isolated ? 'network namespace' : await this.firewallState();
    const enforced = isolated || firewall.startsWith('uid ');
    if (network === null && !enforced && spec.broker === undefined) return { env: () => ({}) };
    emit({ ...base, state: 'started' });
    try {
      const proxy = await this.started();
      const allowedHosts = network ? [...new Set(network.allowed_hosts)] : null;
      const reach = [...new Set(spec.reach ?? [])];
      const data: Record<string, unknown> = network
        ? { mode: 'proxy', allowed_hosts: allowedHosts, firewall }
        : { mode: 'unrestricted', firewall };
      data.isolation = isolation?.mode ?? 'none';
      let bridges: { socketDir: string; ports: number[]; proxyPort: number } | undefined;
      if (isolated) {
        bridges = await proxy.bridge(sandbox, loopbackPorts([...(allowedHosts ?? []), ...reach]), isolation?.user);
        data.note =
          'the sandbox’s network holds loopback only: HTTP(S) through the runner’s proxy is the one way out (no DNS, no UDP, no raw sockets)';
      } else if (network && !enforced) {
        data.note = 'the proxy is advisory: a process that ignores HTTP(S)_PROXY is not stopped';
      } else if (!network) data.note = 'only HTTP(S) through the runner’s proxy leaves the machine';
      emit({ ...base, state: 'done', duration_ms: Date.now() - startedAt, data: JSON.stringify(data) });
      const urls = new Map<string, string>();
      const broker = () => this.brokers.get(sandbox);
      return {
        ...(bridges ? { bridges: { socketDir: bridges.socketDir, ports: bridges.ports } } : {}),
        env: (conv, bindings): Record<string, string> => {
          const held = broker();
          if (held && bindings) {
            held.add(bindings);
            held.conversationId = conv;
          }
          let url = urls.get(conv);
          if (!url) {
            url = proxy.grant({ sandbox, incarnation, conversationId: conv, allowedHosts, reach }, bridges?.proxyPort);
            urls.set(conv, url);
          }
          return {
            HTTP_PROXY: url,
            HTTPS_PROXY: url,
            http_proxy: url,
            https_proxy: url,
            NO_PROXY,
            no_proxy: NO_PROXY,
          };
        },
      };
    } catch (err) {
      const message = `egress policy not applied: ${(err as Error).message}`;
      emit({ ...base, state: 'failed', duration_ms: Date.now() - startedAt, data: message });
      throw new Error(message);
    }
  }

  /** Each brokered sandbox's broker (prepared by `prepareBroker`), by sandbox. */
  private readonly brokers = new Map<string, SandboxBroker>();

  /**
   * Runs stage `broker` for a brokered sandbox (after `network`): a certificate authority of its
   * own, whose certificate (PEM) the caller gives the sandbox to trust and whose key stays here,
   * and the build's bound secrets. From then on the proxy reads the sandbox's requests, writes
   * bound secrets for their hosts, refuses placeholders elsewhere, and logs them (OnEgress).
   */
  async prepareBroker(
    spec: { id: string; incarnation: number; conversationId: string; broker?: readonly BrokerBinding[] | undefined },
    emit: Emit,
  ): Promise<SandboxBroker> {
    const base = {
      conversation_id: spec.conversationId,
      kind: 'stage' as const,
      stream: 'stage' as const,
      stage: 'broker',
    };
    const startedAt = Date.now();
    emit({ ...base, state: 'started' });
    try {
      const proxy = await this.started();
      const broker = new SandboxBroker(await SandboxCa.create(spec.id), spec.conversationId);
      broker.add(spec.broker ?? []);
      this.brokers.set(spec.id, broker);
      proxy.setBroker(spec.id, spec.incarnation, broker);
      const data = { ca: 'made for this sandbox; its key stays with the runner', bindings: (spec.broker ?? []).length };
      emit({ ...base, state: 'done', duration_ms: Date.now() - startedAt, data: JSON.stringify(data) });
      return broker;
    } catch (err) {
      const message = `the egress credential broker could not be prepared: ${(err as Error).message}`;
      emit({ ...base, state: 'failed', duration_ms: Date.now() - startedAt, data: message });
      throw new Error(message);
    }
  }

  /** The sandbox's proxy credentials stop working (it was destroyed or rebuilt). */
  async forget(sandbox: string): Promise<void> {
    this.brokers.delete(sandbox);
    await this.proxy?.then((p) => p.revoke(sandbox)).catch(() => {});
  }

  async close(): Promise<void> {
    const proxy = await this.proxy?.catch(() => undefined);
    await proxy?.close();
  }
}
