import t from 'tap';
import { signUp, twoNodes } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { blockText, type WireEvent } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const CREDENTIAL = 'sk-ant-test-credential-123456';

/**
 * A turn's output is appended by the node that holds its runner, which need not be the node
 * that launched the turn and registered its secrets (a load balancer picks each request's
 * node, and a runner reconnects wherever it lands). Every node redacts a conversation's
 * output all the same, with every secret of every turn so far, also when the runtime spells
 * a value out a few characters at a time.
 */
t.test(
  'two nodes: output of a turn launched through one node is redacted by the node holding its runner',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres shared by two nodes' },
  async (t) => {
    const { a, b } = await twoNodes(t, {
      RUNNER_HEARTBEAT_MS: '300',
      RUNNER_GRACE_MS: '3000',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
    });
    const me = await signUp(a);
    const token = me.key;
    const { agent, runnerRow } = await claudeOnRunner(t, b, token);
    t.ok(b.fabric.isLive(runnerRow.id) && !a.fabric.isLive(runnerRow.id), 'node B holds the runner');

    const turns = async (id: string) =>
      (await a.http.get(`/api/conversations/${id}/turns`, { token })).body.data as { state: string }[];
    const settled = async (id: string, n: number) => {
      for (let i = 0; i < 600; i++) {
        const turn = (await turns(id))[n - 1];
        if (turn && turn.state !== 'running') return turn;
        await sleep(50);
      }
      throw new Error('still running');
    };
    const events = async (id: string) =>
      (await a.http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];

    const conv = await a.http.post('/api/conversations', {
      token,
      body: { agent_id: agent.id, prompt: 'print env ANTHROPIC_API_KEY' },
    });
    t.equal(conv.status, 201, JSON.stringify(conv.body));
    const id = conv.body.id as string;
    t.equal((await settled(id, 1)).state, 'done', 'launched through node A, run by the runner on node B');
    const blocks = async (kind: string) => blockText(await events(id), kind);
    t.notOk(JSON.stringify(await events(id)).includes(CREDENTIAL), 'the credential is nowhere in the log');
    t.equal(
      await blocks('text'),
      'You said: print env ANTHROPIC_API_KEY. ANTHROPIC_API_KEY=[REDACTED].',
      'the reply reads [REDACTED] for it',
    );

    // The next turn gets a new sandbox token; the runtime spells it out three characters a chunk.
    const next = await a.http.post(`/api/conversations/${id}/prompts`, {
      token,
      body: { prompt: 'spell env SVC_SANDBOX_TOKEN and spell env ANTHROPIC_API_KEY' },
    });
    t.equal(next.status, 201, JSON.stringify(next.body));
    t.equal((await settled(id, 2)).state, 'done');
    const all = await events(id);
    t.equal(
      await blocks('text'),
      'You said: print env ANTHROPIC_API_KEY. ANTHROPIC_API_KEY=[REDACTED].' +
        'SVC_SANDBOX_TOKEN=[REDACTED]. You said: spell env SVC_SANDBOX_TOKEN and spell env ANTHROPIC_API_KEY.',
      'the second turn’s token, spelled out three characters a chunk, reads [REDACTED], no piece of it left',
    );
    t.match(await blocks('thinking'), /spelling SVC_SANDBOX_TOKEN=\[REDACTED\]$/, 'so does the thought spelling it');
    const stderr = all
      .filter((e) => e.stream === 'stderr')
      .map((e) => e.data)
      .join('');
    t.match(stderr, /spelled SVC_SANDBOX_TOKEN=\[REDACTED\]\n/, 'on stderr too');
    t.notOk(JSON.stringify(all).includes(CREDENTIAL), 'the credential is still nowhere');
    const keys = (await a.http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as WireEvent[];
    t.notMatch(
      JSON.stringify(keys),
      /svcs_[A-Za-z0-9_-]{3}/,
      'no sandbox token, nor a piece of one, in the raw events',
    );
  },
);
