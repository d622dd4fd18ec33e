/**
 * The docs page in a real browser (Chromium through playwright-core), served over plain HTTP
 * on an address that is not loopback, as with HOST=0.0.0.0 or in Docker: it renders the whole
 * description, every script and style loading from the instance itself.
 */
import { networkInterfaces } from 'node:os';
import { chromium } from 'playwright-core';
import t from 'tap';
import { startTestService } from './harness.ts';

/** An IPv4 address of this machine that is not loopback, if it has one. */
function outsideAddress(): string | undefined {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return undefined;
}

const address = outsideAddress();

t.test(
  'the docs page renders over plain HTTP on an address that is not loopback',
  { skip: address === undefined && 'this machine has no address but loopback' },
  async (t) => {
    const svc = await startTestService(t, { backend: 'embedded', env: { HOST: '0.0.0.0' } });
    const base = `http://${address}:${new URL(svc.url).port}`;
    // Root runs Chromium only without its sandbox; the page is our own.
    const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
    t.teardown(() => browser.close());
    const page = await browser.newPage();
    const failed: string[] = [];
    page.on('requestfailed', (r) => failed.push(`${r.url()} ${r.failure()?.errorText}`));
    const refused: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error') refused.push(m.text());
    });
    const res = await page.goto(`${base}/api/docs`, { waitUntil: 'load' });
    t.equal(res?.status(), 200);
    t.notMatch(res?.headers()['content-security-policy'] ?? '', /upgrade-insecure-requests/);
    const title = await page.waitForSelector('.swagger-ui .info .title', { timeout: 30_000 });
    t.match(await title.textContent(), /Agent sandbox service API/, 'the description is rendered');
    const register = page.locator('.opblock', { hasText: '/api/auth/register' }).first();
    await register.waitFor({ timeout: 30_000 });
    await page.screenshot({ path: '.tap/docs-page.png' });
    t.ok(await page.locator('.opblock').count(), 'its operations are drawn');
    t.equal(await register.locator('.authorization__btn').count(), 0, 'a public one shows no lock');
    t.same(failed, [], 'every script and style loaded');
    t.same(refused, [], 'and the browser refused nothing');
  },
);
