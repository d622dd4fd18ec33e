import type { Test } from 'tap';
import { type Backend, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { until } from './until.ts';

export interface TurnWire {
  id: string;
  number: number;
  state: string;
  prompt: string;
  reply: string | null;
}

/**
 * What the team's tests start from: a service whose runtimes are the scripted ACP agent, two
 * accounts with an Anthropic credential each, an environment `main`, and helpers to make
 * agents, wait for turns and presence, and watch `/api/team/stream`.
 */
export async function teamSetUp(t: Test, backend: Backend, env: Record<string, string> = {}) {
  const svc = await startTestService(t, {
    backend,
    env: {
      LOG_COPY_INTERVAL_MS: '50',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      // Each teammate keeps a machine of its own.
      SANDBOX_QUOTA_DEFAULT: '50',
      ...env,
    },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const other = await signUp(svc);
  const token = me.key;
  for (const key of [token, other.key]) {
    const credential = await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token: key,
      body: { value: 'sk-ant-test-credential-123456' },
    });
    t.equal(credential.status, 200);
  }
  const mainEnv = (await http.post('/api/environments', { token, body: { name: 'main' } })).body as { id: string };
  const agentOf = async (key: string, name: string, extra: Record<string, unknown> = {}, envId = mainEnv.id) => {
    const body = { name, runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: envId, ...extra };
    const res = await http.post('/api/agents', { token: key, body });
    t.equal(res.status, 201, res.text);
    return res.body as { id: string; name: string };
  };
  const turnsOf = async (conversationId: string) =>
    (await http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data as TurnWire[];
  /** Where a conversation stands, for a failure's message: its turns and its last stage events. */
  const standing = async (conversationId: string) => {
    const turns = (await turnsOf(conversationId)).map((x) => `${x.number} ${x.state}`);
    const events = (await http.get(`/api/conversations/${conversationId}/events?limit=1000`, { token })).body.data as {
      kind: string;
      stage?: string;
      state?: string;
      data?: string;
    }[];
    const stages = events
      .filter((e) => e.kind !== 'output')
      .slice(-15)
      .map((e) => `${e.kind}:${e.stage ?? ''}:${e.state ?? ''}`);
    return `turns [${turns.join(', ')}], last events [${stages.join(' ')}]`;
  };
  const settled = async (conversationId: string, number: number) => {
    try {
      return await until(
        `turn ${number} of ${conversationId} ends`,
        async () => {
          const turn = (await turnsOf(conversationId)).find((x) => x.number === number);
          return turn && turn.state !== 'running' ? turn : undefined;
        },
        30_000,
      );
    } catch (err) {
      throw new Error(`${(err as Error).message}: ${await standing(conversationId)}`);
    }
  };
  const presenceOf = async (agentId: string) =>
    (await http.get(`/api/team/${agentId}`, { token })).body.presence as { state: string; label: string };
  /** Resolves once the teammate's machine is built and idle. */
  const online = (agentId: string) =>
    until(`${agentId} online`, async () => (await presenceOf(agentId))?.state === 'online', 30_000);
  /** A watcher of `/api/team/stream`, closed when `t` ends. */
  const teamStream = (t: Test, key = token) => {
    const w = rawGet(svc, '/api/team/stream', { authorization: `Bearer ${key}` });
    t.teardown(() => w.sock.destroy());
    return {
      events: () => frames(w.text()).map(parseFrame),
      connected: () => until('the stream is open', () => frames(w.text()).length > 0),
    };
  };
  return {
    svc,
    http,
    token,
    accountId: me.accountId,
    other,
    env: mainEnv,
    agentOf,
    turnsOf,
    settled,
    presenceOf,
    online,
    teamStream,
  };
}
