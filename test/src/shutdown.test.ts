/**
 * Stopping `npm start`: SIGTERM stops the service whichever process of it receives it (npm's,
 * or node's), connected runners are told `going_away` (1001) so they reconnect elsewhere, and
 * the port and the data directory are free afterwards.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { accepts, gone, npmStart, signUpAt } from './npm-start.ts';
import { startRunnerProcess } from './runner-process.ts';
import { until } from './until.ts';

t.test('SIGTERM to the npm start process stops node; a connected runner is told going_away', async (t) => {
  const svc = await npmStart(t);
  t.ok(svc.node, 'node runs below npm');
  const key = await signUpAt(svc.url, svc.dataDir);
  const created = await fetch(`${svc.url}/api/runners`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ name: 'box' }),
  });
  const { token } = (await created.json()) as { token: string };
  const runner = await startRunnerProcess(t, svc.url, token);

  process.kill(svc.npm.pid as number, 'SIGTERM');
  await until('node to exit', () => gone(svc.node), 30_000);
  t.pass('the node process exited');
  t.equal(await accepts(svc.port), false, 'nothing listens on the port');
  t.notOk(existsSync(join(svc.dataDir, 'svc.lock')), 'DATA_DIR is released');
  await until('the runner to report the close', () => /connection lost \(1001/.test(runner.output), 10_000).catch(
    () => undefined,
  );
  t.match(runner.output, /connection lost \(1001: the service is shutting down\)/, 'the runner heard 1001 going_away');
});

t.test('SIGTERM to the node process stops it too', async (t) => {
  const svc = await npmStart(t);
  process.kill(svc.node, 'SIGTERM');
  await until('node to exit', () => gone(svc.node), 30_000);
  t.equal(await accepts(svc.port), false, 'nothing listens on the port');
  await until('npm to exit', () => gone(svc.npm.pid as number), 30_000);
  t.pass('npm exits with it');
});

for (const edge of [true, false]) {
  t.test(`a service closing tells its runners going_away (EDGE=${edge})`, async (t) => {
    const svc = await startTestService(t, { backend: 'embedded', env: { EDGE: String(edge) } });
    const me = await signUp(svc);
    const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'box' } });
    const runner = await startRunnerProcess(t, svc.url, created.body.token as string);
    await svc.close();
    await until('the runner to report the close', () => /connection lost/.test(runner.output), 10_000).catch(
      () => undefined,
    );
    t.match(runner.output, /connection lost \(1001: the service is shutting down\)/);
  });
}
