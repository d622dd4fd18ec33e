import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeFrame, RUNNER_CLOSE } from '@svc/core';
import t from 'tap';
import WebSocket from 'ws';
import { collectOutput } from './child-output.ts';
import { signUp, startTestService, transportSetups } from './harness.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));

/** A real `svc-runner` process, its output collected. */
function runner(args: string[]) {
  const child: ChildProcess = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const { out, err, exited } = collectOutput(child);
  return {
    child,
    exited,
    out,
    err,
    /** Waits until stdout matches (or 15 s). */
    async saw(re: RegExp): Promise<boolean> {
      for (let i = 0; i < 300 && !re.test(out()); i++) await sleep(50);
      return re.test(out());
    },
  };
}

/** `p`'s value, or 'timeout' once `ms` have passed; the timer is cleared either way. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  const lapsed = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  try {
    return await Promise.race([p, lapsed]);
  } finally {
    clearTimeout(timer);
  }
}

for (const { backend, edge } of transportSetups()) {
  t.test(`runners on ${backend}, ${edge ? 'through the edge' : 'api role alone (EDGE=false)'}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { RUNNER_HEARTBEAT_MS: '200', RUNNER_GRACE_MS: '1500', EDGE: String(edge) },
    });
    const me = await signUp(svc);
    const other = await signUp(svc);
    const root = mkdtempSync(join(tmpdir(), 'svc-runner-root-'));
    const running: ReturnType<typeof runner>[] = [];
    const start = (args: string[]) => {
      const r = runner(args);
      running.push(r);
      return r;
    };
    t.teardown(() => {
      for (const r of running) r.child.kill('SIGKILL');
    });

    const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'build box' } });
    t.equal(created.status, 201);
    const { token, id } = created.body as { token: string; id: string };
    t.match(created.body, { name: 'build box', online: false, hostname: null, last_seen: null });
    t.match(token, /^svcr_[A-Za-z0-9_-]{43}$/, 'a 256-bit token, shown once');

    t.test('the token is kept only as a hash and never listed again', async (t) => {
      const list = await svc.http.get('/api/runners', { token: me.key });
      t.equal(list.body.data.length, 1);
      t.notOk('token' in list.body.data[0], 'the list has no token');
      const [row] = await svc.db.sql<{ token_hash: Buffer }[]>`SELECT token_hash FROM runners WHERE id = ${id}`;
      t.same(row?.token_hash, createHash('sha256').update(token).digest(), 'SHA-256 at rest');
      t.notMatch(JSON.stringify(await svc.db.sql`SELECT * FROM runners`), token.slice(5));
      const bad = await svc.http.post('/api/runners', { token: me.key, body: { name: '  ' } });
      t.equal(bad.status, 422);
      t.equal(bad.body.error, 'validation_failed');
    });

    let first: ReturnType<typeof runner>;
    t.test('a real svc-runner connects; the owner sees it online with what it said in its hello', async (t) => {
      first = start(['--url', svc.url, '--token', token, '--root', root]);
      t.ok(await first.saw(/connected as runner rnr_\w+ \(connection 1\)/), first.out() + first.err());
      t.match(first.out(), /connecting to ws:\/\/127\.0\.0\.1:\d+\/api\/runners\/connect/, 'it says where it connects');
      const [r] = (await svc.http.get('/api/runners', { token: me.key })).body.data;
      t.match(r, { id, name: 'build box', online: true, hostname: hostname(), path: root, version: '0.1.0' });
      t.ok(Date.parse(r.last_seen) > Date.now() - 5000, 'last_seen is recent');
      t.same(
        (await svc.http.get('/api/runners', { token: other.key })).body.data,
        [],
        "another tenant's list is empty",
      );
      const theirs = await svc.http.delete(`/api/runners/${id}`, { token: other.key });
      t.equal(theirs.status, 404, "another tenant's runner is 404");
      t.equal(theirs.body.error, 'not_found');
      t.ok(svc.fabric.isLive(id), 'and it stays connected');
    });

    t.test('the server cuts the connection: the runner reconnects with backoff, as a new epoch', async (t) => {
      t.ok(svc.fabric.disconnectHere({ runnerId: id }, RUNNER_CLOSE.going_away, 'test cut'));
      t.ok(await first.saw(/connection lost \(1001: test cut\); trying again in/));
      t.ok(await first.saw(/reconnected as runner rnr_\w+ \(connection 2\)/), first.out());
      const [r] = (await svc.http.get('/api/runners', { token: me.key })).body.data;
      t.equal(r.online, true);
    });

    t.test('a runner that goes silent is closed after the grace and shown offline; it comes back', async (t) => {
      first.child.kill('SIGSTOP');
      await sleep(2500);
      const [r] = (await svc.http.get('/api/runners', { token: me.key })).body.data;
      t.equal(r.online, false, 'offline once its heartbeats stopped for longer than the grace');
      t.notOk(svc.fabric.isLive(id), 'its connection was closed');
      first.child.kill('SIGCONT');
      t.ok(await first.saw(/reconnected as runner rnr_\w+ \(connection 3\)/), first.out());
      t.equal((await svc.http.get('/api/runners', { token: me.key })).body.data[0].online, true);
    });

    t.test('a second svc-runner with the same token waits while the first is connected, then takes over', async (t) => {
      const second = start(['--url', svc.url, '--token', token, '--root', join(root, 'second')]);
      t.ok(
        await second.saw(
          /waiting: another svc-runner on \S+ is connected with this runner token; one token serves one machine/,
        ),
        second.out() + second.err(),
      );
      t.ok(svc.fabric.isLive(id), 'the first stays connected');
      t.notMatch(first.out() + first.err(), /connection lost \(4001/, 'and was never cut off');
      t.equal(first.child.exitCode, null, 'and runs on');
      first.child.kill('SIGTERM');
      t.equal(await within(first.exited, 10_000), 0, 'the first stops when told to');
      t.ok(await second.saw(/connected as runner rnr_\w+ \(connection 4\)/), second.out() + second.err());
      t.equal(second.child.exitCode, null, 'the second took over, without exiting in between');

      const deleted = await svc.http.delete(`/api/runners/${id}`, { token: me.key });
      t.equal(deleted.status, 204);
      t.equal(await within(second.exited, 10_000), 6, 'deleting the runner closes its connection: exit code 6');
      t.match(second.err(), /deleted by its owner/);
      t.same((await svc.http.get('/api/runners', { token: me.key })).body.data, []);
      const again = start(['--url', svc.url, '--token', token, '--root', root]);
      t.equal(await within(again.exited, 10_000), 5, 'its token no longer works: exit code 5');
      t.match(again.err(), /refused the runner token \(401\)/);
    });

    t.test('bad input stops svc-runner at once with a clear message', async (t) => {
      const cases: [string[], number, RegExp][] = [
        [['--url', 'not a url', '--token', token, '--root', root], 3, /--url: not a URL/],
        [['--url', 'ftp://example.com', '--token', token, '--root', root], 3, /http\(s\):\/\/ or ws\(s\):\/\//],
        [['--url', 'http://127.0.0.1:1', '--token', token, '--root', root], 4, /cannot reach .*connection refused/],
        [['--url', svc.url, '--token', 'svc_notarunnertoken', '--root', root], 5, /not a runner token/],
        [['--url', svc.url, '--token', token], 2, /--root is required/],
      ];
      for (const [args, code, message] of cases) {
        const r = start(args);
        t.equal(await within(r.exited, 10_000), code, `exit ${code}: ${args.join(' ')}`);
        t.match(r.err(), message);
      }
    });

    t.test('the endpoint speaks only the protocol: no token 401, a bad frame or version is closed', async (t) => {
      const fresh = await svc.http.post('/api/runners', { token: me.key, body: { name: 'raw' } });
      const wsUrl = `${svc.url.replace(/^http/, 'ws')}/api/runners/connect`;
      // Without a token the upgrade is answered 401 in the spec's error shape, before any WebSocket.
      const anonymous = await new Promise<{ status: number; body: string }>((resolve) => {
        const ws = new WebSocket(wsUrl);
        ws.on('unexpected-response', (_req, res) => {
          let body = '';
          res.on('data', (d: Buffer) => {
            body += d;
          });
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        ws.on('error', () => {});
      });
      t.equal(anonymous.status, 401);
      t.equal(JSON.parse(anonymous.body).error, 'unauthorized');
      const closeOf = (frames: Uint8Array[]) =>
        new Promise<number>((resolve) => {
          const ws = new WebSocket(wsUrl, { headers: { authorization: `Bearer ${fresh.body.token}` } });
          ws.on('open', () => {
            for (const f of frames) ws.send(f);
          });
          ws.on('close', (code) => resolve(code));
          ws.on('error', () => {});
        });
      t.equal(await closeOf([new Uint8Array([0xc1, 0x00])]), RUNNER_CLOSE.protocol_error, 'not msgpack');
      t.equal(await closeOf([encodeFrame({ t: 'heartbeat' })]), RUNNER_CLOSE.protocol_error, 'no hello first');
      const hello = {
        t: 'hello' as const,
        protocol: 99,
        version: '9.9.9',
        instance: 'abcdefgh12345678',
        hostname: 'h',
        root: '/r',
        capabilities: [],
        sandboxes: [],
      };
      t.equal(await closeOf([encodeFrame(hello)]), RUNNER_CLOSE.unsupported_protocol, 'an unknown protocol version');
    });
  });
}
