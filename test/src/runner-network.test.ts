import { mkdtempSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { type AgentEvent, RunnerAgent } from '../../runner-agent/src/agent.ts';
import { signUp, startTestService } from './harness.ts';
import { eventually } from './until.ts';

const until = (check: () => boolean, ms = 10_000) => eventually(check, ms);

/** A TCP proxy to `port`: the network between a runner and the service, which the test can cut. */
function proxyTo(port: number) {
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  return {
    /** Listens on `at` (0: any free port); resolves the port. */
    open(at: number): Promise<number> {
      server = createServer((client) => {
        const upstream = connect(port, '127.0.0.1');
        for (const s of [client, upstream]) {
          sockets.add(s);
          s.on('error', () => {});
          s.on('close', () => sockets.delete(s));
        }
        client.on('close', () => upstream.destroy());
        upstream.on('close', () => client.destroy());
        client.pipe(upstream).pipe(client);
      });
      const listening = server;
      return new Promise((resolve) =>
        listening.listen(at, '127.0.0.1', () => resolve((listening.address() as { port: number }).port)),
      );
    },
    /** The path goes: nothing listens any more, and what it carried ends without a word. */
    cut(): void {
      server?.close();
      for (const s of sockets) s.destroy();
    },
  };
}

t.test('the network drops a runner’s connection: it says how, and comes back once the path does', async (t) => {
  const svc = await startTestService(t, { env: { RUNNER_HEARTBEAT_MS: '200', RUNNER_GRACE_MS: '30000' } });
  const me = await signUp(svc);
  const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'behind a proxy' } });
  t.equal(created.status, 201);
  const proxy = proxyTo(Number(new URL(svc.url).port));
  t.teardown(() => proxy.cut());
  const port = await proxy.open(0);

  const seen: AgentEvent[] = [];
  const agent = new RunnerAgent(
    {
      url: `http://127.0.0.1:${port}`,
      token: created.body.token,
      root: mkdtempSync(join(tmpdir(), 'svc-runner-net-')),
      backoffMs: { first: 100, max: 200 },
    },
    (e) => seen.push(e),
  ).start();
  t.teardown(() => agent.stop());
  const of = <K extends AgentEvent['type']>(type: K) =>
    seen.filter((e): e is Extract<AgentEvent, { type: K }> => e.type === type);
  t.ok(await until(() => of('connected').length === 1), 'connected through the proxy');

  proxy.cut();
  t.ok(await until(() => of('disconnected').length >= 2), JSON.stringify(seen));
  const [dropped, refused] = of('disconnected');
  t.match(dropped, { code: 1006, reason: 'closed without a close frame' }, 'the drop is named');
  t.match(refused, { code: 1006, reason: /^ECONNREFUSED: / }, 'and so is why the next attempt failed');
  t.equal(of('stopped').length, 0, 'it keeps trying');

  await proxy.open(port);
  t.ok(await until(() => of('connected').length === 2), JSON.stringify(seen));
  t.match(of('connected')[1], { reconnected: true, epoch: 2 });
  t.ok(svc.fabric.isLive(created.body.id), 'the service holds it again');
});
