import { readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { supportReports } from '@svc/db';
import t from 'tap';
import { loadConfig } from '../../gateway/src/config.ts';
import { githubIssues } from '../../gateway/src/issues/issues.github.ts';
import { fileMailer, readMailFile } from '../../gateway/src/mail/mail.file.ts';
import type { MailMessage } from '../../gateway/src/mail/mail.ts';
import type { ForwardDeps } from '../../gateway/src/services/support-forwarding.ts';
import { SupportForwarder } from '../../gateway/src/workers/support-forwarder.ts';
import { PNG } from '../fixtures/images.ts';
import { startFakeGithub } from './fakes/github-issues.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { until } from './until.ts';

const TOKEN = 'ghp_support0123456789abcdefghijklmnopqrs';
const REPO = 'acme/support';
const SUPPORT_EMAIL = 'support@ops.example';
const LEASE_MS = 10 * 60_000;
const RETRY_MS = 60_000;

/** Every mail the file mailer wrote to `dir`, with attachments decoded, oldest first. */
async function mailbox(dir: string): Promise<MailMessage[]> {
  const names = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith('.json')).sort();
  return Promise.all(names.map((f) => readMailFile(join(dir, f))));
}

t.test('configuration: a repository needs its token and the token its repository', async (t) => {
  t.throws(
    () => loadConfig({ SUPPORT_GITHUB_REPOSITORY: REPO }),
    /SUPPORT_GITHUB_TOKEN: required when SUPPORT_GITHUB_REPOSITORY is set/,
  );
  t.throws(
    () => loadConfig({ SUPPORT_GITHUB_TOKEN: TOKEN }),
    /SUPPORT_GITHUB_REPOSITORY: required when SUPPORT_GITHUB_TOKEN is set/,
  );
  t.throws(
    () => loadConfig({ SUPPORT_GITHUB_REPOSITORY: 'just-a-name', SUPPORT_GITHUB_TOKEN: TOKEN }),
    /must be owner\/name/,
  );
  t.throws(() => loadConfig({ SUPPORT_EMAIL: 'not an address' }), /SUPPORT_EMAIL: must be an email address/);
  t.match(loadConfig({ SUPPORT_GITHUB_REPOSITORY: REPO, SUPPORT_GITHUB_TOKEN: TOKEN, SUPPORT_EMAIL }), {
    SUPPORT_GITHUB_API_URL: 'https://api.github.com',
    SUPPORT_FORWARD_INTERVAL_MS: 10_000,
    SUPPORT_FORWARD_ATTEMPTS: 6,
  });
});

for (const backend of backends()) {
  t.test(`support forwarding on ${backend}`, async (t) => {
    const github = await startFakeGithub({ token: TOKEN, repositories: [REPO] });
    t.teardown(() => github.close());
    // The service's own forwarder stays off: the workers here run on a clock the test moves.
    const svc = await startTestService(t, { backend, env: { SUPPORT_FORWARD_INTERVAL_MS: '0' } });
    const { http } = svc;
    const alice = await signUp(svc);
    const bob = await signUp(svc);
    let clock = new Date();
    const issues = (token = TOKEN) => githubIssues({ apiUrl: github.url, repository: REPO, token, timeoutMs: 5000 });
    const forwarder = (deps: Partial<ForwardDeps> = {}, maxAttempts = 3) =>
      new SupportForwarder(
        {
          sql: svc.db.sql,
          issues: issues(),
          mail: { mailer: svc.mailer, to: SUPPORT_EMAIL },
          now: () => clock,
          logger: svc.log,
          ...deps,
        },
        { periodMs: 0, leaseMs: LEASE_MS, maxAttempts, retryBaseMs: RETRY_MS },
      );
    const send = async (key: string, body: Record<string, unknown> = {}) => {
      const res = await http.post('/api/support/reports', {
        token: key,
        body: { category: 'bug', message: 'Something went wrong.', ...body },
      });
      t.equal(res.status, 201, res.text);
      // A report is due from the moment it is stored; the test's clock never runs behind that.
      clock = new Date(Math.max(clock.getTime(), Date.now() + 1000));
      return res.body as { id: string };
    };
    const get = async (id: string, key = alice.key) =>
      (await http.get(`/api/support/reports/${id}`, { token: key })).body;
    const issuesOf = (id: string) => github.issues.filter((i) => i.body.includes(id));
    const mailsOf = async (id: string) => (await mailbox(svc.mailDir)).filter((m) => m.text.includes(id));

    t.test('a report becomes an issue and a mail with its screenshot attached', async (t) => {
      const message = 'The conversation stopped answering.\n```\nnot a fence of ours\n```\n@octocat please look';
      const mine = await send(alice.key, {
        category: 'stuck',
        message: `${message}\nmy key: ${alice.key}`,
        context: { conversation_id: 'cnv_alice', app_version: '1.4.2' },
        client: 'svc-web 1.4.2',
        screenshot: { data: PNG.toString('base64'), media_type: 'image/png' },
      });
      const theirs = await send(bob.key, { message: 'Bob only: the team page is blank.' });
      t.equal(await forwarder().pass(), 2);

      const report = await get(mine.id);
      t.match(report, { status: 'forwarded', forwarded_at: clock.toISOString(), forward_error: null });
      const [issue] = issuesOf(mine.id);
      t.ok(issue, 'an issue was opened');
      t.equal(report.external_url, issue?.html_url, "the issue's html_url is the report's external_url");
      t.same(issue?.labels, ['support', 'stuck']);
      t.equal(issue?.title, '[stuck] The conversation stopped answering.');
      t.match(issue?.headers, {
        authorization: `Bearer ${TOKEN}`,
        accept: 'application/vnd.github+json',
        'x-github-api-version': '2022-11-28',
        'user-agent': /./,
      });
      const body = issue?.body ?? '';
      t.ok(body.includes(`\`\`\`\`text\n${message}`), 'the message sits whole in a fence it cannot close');
      t.ok(body.includes('"conversation_id": "cnv_alice"') && body.includes('"app_version": "1.4.2"'), 'the context');
      t.ok(body.includes(alice.accountId) && body.includes('svc-web 1.4.2'));
      t.ok(body.includes(`Screenshot: image/png, ${PNG.length} bytes, attached to the support mail.`));
      t.notOk(body.includes(alice.key), 'no credential');
      t.notOk(body.includes(alice.email), 'no email address on an issue');
      t.notOk(body.includes('Bob only') || body.includes(bob.accountId), "nothing of Bob's");
      const bobsIssue = issuesOf(theirs.id)[0]?.body ?? '';
      t.ok(bobsIssue.includes('Bob only: the team page is blank.'));
      t.notOk(bobsIssue.includes('stopped answering') || bobsIssue.includes(alice.accountId), "nothing of Alice's");

      const mails = await mailsOf(mine.id);
      t.equal(mails.length, 1, 'one mail');
      const mail = mails[0] as MailMessage;
      t.equal(mail.to, SUPPORT_EMAIL);
      t.equal(mail.subject, '[stuck] The conversation stopped answering.');
      t.ok(mail.text.includes(message) && mail.text.includes('"conversation_id": "cnv_alice"'));
      t.ok(mail.text.includes(`${alice.accountId} <${alice.email}>`), 'the reporter, so support can answer');
      t.ok(mail.text.includes(`Issue: ${issue?.html_url}`), 'the issue is linked');
      t.notOk(mail.text.includes(alice.key) || mail.html.includes(alice.key), 'no credential');
      t.notOk(mail.text.includes('Bob only'), "nothing of Bob's");
      t.same(mail.attachments, [{ filename: `screenshot-${mine.id}.png`, contentType: 'image/png', content: PNG }]);
      t.same((await mailsOf(theirs.id))[0]?.attachments, undefined, 'no screenshot, no attachment');

      const opened = github.issues.length;
      t.equal(await forwarder().pass(), 0, 'nothing left to forward');
      t.equal(github.issues.length, opened, 'no issue twice');
    });

    t.test("a report at every limit fits GitHub's issue body limit, cut with a note", async (t) => {
      const context: Record<string, string> = {};
      for (let i = 0; JSON.stringify(context).length < 64 * 1024 - 200; i++) context[`event_${i}`] = 'x'.repeat(100);
      const r = await send(alice.key, { message: 'm'.repeat(20 * 1024), context });
      t.equal(await forwarder({ mail: undefined }).pass(), 1);
      t.match(await get(r.id), { status: 'forwarded', forward_error: null });
      const body = issuesOf(r.id)[0]?.body ?? '';
      t.ok(body.length <= 65_536, `${body.length} characters`);
      t.ok(body.includes('m'.repeat(20 * 1024)), 'the message whole');
      t.ok(
        body.includes(`(cut to fit the issue; the whole report is kept as ${r.id})`),
        'the context cut, and said so',
      );
    });

    t.test('a host that fails is retried later; the mail that went is not sent again', async (t) => {
      github.failNext(2, 503);
      const r = await send(alice.key);
      const w = forwarder();
      t.equal(await w.pass(), 1);
      let report = await get(r.id);
      t.equal(report.status, 'new', 'still due for another attempt');
      t.match(report.forward_error, /answered 503: Service Unavailable\. \(attempt 1 of 3\)$/);
      t.equal((await mailsOf(r.id)).length, 1, 'the mail went on the first attempt');
      t.equal(await w.pass(), 0, 'not again before the retry wait');
      clock = new Date(clock.getTime() + RETRY_MS);
      t.equal(await w.pass(), 1);
      t.match((await get(r.id)).forward_error, /\(attempt 2 of 3\)$/);
      clock = new Date(clock.getTime() + 2 * RETRY_MS);
      t.equal(await w.pass(), 1);
      report = await get(r.id);
      t.match(report, { status: 'forwarded', forward_error: null, forwarded_at: clock.toISOString() });
      t.equal(issuesOf(r.id).length, 1, 'one issue');
      t.equal(report.external_url, issuesOf(r.id)[0]?.html_url);
      t.equal((await mailsOf(r.id)).length, 1, 'one mail in all');
    });

    t.test('a report that fails every attempt ends failed with forward_error', async (t) => {
      github.failNext(3, 502);
      const r = await send(alice.key);
      const w = forwarder();
      for (let attempt = 1; attempt <= 3; attempt++) {
        t.equal(await w.pass(), 1, `attempt ${attempt}`);
        clock = new Date(clock.getTime() + 2 ** (attempt - 1) * RETRY_MS);
      }
      const report = await get(r.id);
      t.match(report, {
        status: 'failed',
        forwarded_at: null,
        external_url: null,
        forward_error: `GitHub ${REPO} at ${new URL(github.url).host} answered 502: Server Error. (attempt 3 of 3)`,
      });
      t.equal(await w.pass(), 0, 'a failed report is never tried again');
      t.same(issuesOf(r.id), []);
    });

    t.test('a bad token fails with what GitHub said, and never shows the token', async (t) => {
      const r = await send(alice.key);
      t.equal(await forwarder({ issues: issues('ghp_wrong-token-1234567890'), mail: undefined }, 1).pass(), 1);
      const report = await get(r.id);
      t.equal(report.status, 'failed');
      t.equal(
        report.forward_error,
        `GitHub ${REPO} at ${new URL(github.url).host} answered 401: Bad credentials. (attempt 1 of 1)`,
      );
      t.notOk(JSON.stringify(report).includes('ghp_wrong'));
    });

    t.test('a mailbox that refuses: the issue is opened once, the mail retried, then failed', async (t) => {
      const r = await send(alice.key);
      // The mail directory would have to live under a regular file: it cannot be made.
      const refusing = fileMailer(join(svc.dataDir, 'support.test.ts', 'nested'));
      await writeFile(join(svc.dataDir, 'support.test.ts'), '');
      const w = forwarder({ mail: { mailer: refusing, to: SUPPORT_EMAIL } }, 2);
      t.equal(await w.pass(), 1);
      t.match(await get(r.id), {
        status: 'new',
        forward_error: /^Mail to support@ops\.example failed: .*\(attempt 1 of 2\)$/,
      });
      clock = new Date(clock.getTime() + RETRY_MS);
      t.equal(await w.pass(), 1);
      const report = await get(r.id);
      t.match(report, {
        status: 'failed',
        forward_error: /^Mail to support@ops\.example failed: .*\(attempt 2 of 2\)$/,
      });
      t.equal(issuesOf(r.id).length, 1, 'the issue was opened once, not on every attempt');
      t.equal(report.external_url, issuesOf(r.id)[0]?.html_url, 'and is linked even though the report failed');
    });

    t.test('a worker that dies mid-report: its lease expires and the report is forwarded once', async (t) => {
      const r = await send(alice.key);
      // What a worker did before it died: it claimed the report, and never finished it.
      const [claim] = await supportReports.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 10);
      t.equal(claim?.id, r.id);
      const w = forwarder();
      t.equal(await w.pass(), 0, 'the live lease keeps the report from another worker');
      clock = new Date(clock.getTime() + LEASE_MS);
      t.equal(await w.pass(), 1, 'the expired lease is taken over');
      t.match(await get(r.id), { status: 'forwarded' });
      t.equal(issuesOf(r.id).length, 1);
      t.equal((await mailsOf(r.id)).length, 1);
    });

    t.test('two workers share the reports: each is forwarded once', async (t) => {
      const sent = await Promise.all(Array.from({ length: 6 }, (_, i) => send(i % 2 ? alice.key : bob.key)));
      const [a, b] = [forwarder(), forwarder()];
      const done = await Promise.all([a.pass(), b.pass()]);
      t.equal(done[0] + done[1], 6);
      for (const r of sent) {
        t.equal(issuesOf(r.id).length, 1, `${r.id}: one issue`);
        t.equal((await mailsOf(r.id)).length, 1, `${r.id}: one mail`);
      }
    });

    t.test('with no destination configured, reports stay new: the stored rows are the inbox', async (t) => {
      const r = await send(alice.key);
      const requests = github.requests;
      t.equal(await forwarder({ issues: undefined, mail: undefined }).pass(), 0);
      t.match(await get(r.id), { status: 'new', forward_error: null, external_url: null });
      t.equal(github.requests, requests, 'no request to any host');
      t.same(await mailsOf(r.id), []);
    });
  });

  t.test(`a report stored before a restart is forwarded by the restarted service, on ${backend}`, async (t) => {
    const github = await startFakeGithub({ token: TOKEN, repositories: [REPO] });
    t.teardown(() => github.close());
    // Embedded: its PostgreSQL cluster on disk under DATA_DIR (an empty DATABASE_URL), so a restart finds it.
    const a = await startTestService(t, {
      backend,
      env: { SUPPORT_FORWARD_INTERVAL_MS: '0', ...(backend === 'embedded' ? { DATABASE_URL: '' } : {}) },
    });
    const me = await signUp(a);
    const sent = await a.http.post('/api/support/reports', {
      token: me.key,
      body: { category: 'question', message: 'How do I reset a sandbox?' },
    });
    t.equal(sent.status, 201);
    const shared: Record<string, string> =
      backend === 'embedded'
        ? { DATABASE_URL: '', DATA_DIR: a.dataDir, MAIL_DIR: a.mailDir }
        : {
            DATABASE_URL: a.config.DATABASE_URL as string,
            REDIS_URL: a.config.REDIS_URL as string,
            REDIS_KEY_PREFIX: a.config.REDIS_KEY_PREFIX,
            MAIL_DIR: a.mailDir,
          };
    await a.close();
    const b = await startTestService(t, {
      backend,
      env: {
        ...shared,
        MASTER_KEY: a.config.MASTER_KEY as string,
        SUPPORT_FORWARD_INTERVAL_MS: '50',
        SUPPORT_GITHUB_API_URL: github.url,
        SUPPORT_GITHUB_REPOSITORY: REPO,
        SUPPORT_GITHUB_TOKEN: TOKEN,
        SUPPORT_EMAIL,
      },
    });
    const report = await until('the report to be forwarded', async () => {
      const r = (await b.http.get(`/api/support/reports/${sent.body.id}`, { token: me.key })).body;
      return r.status === 'forwarded' && r;
    });
    t.equal(report.external_url, github.issues[0]?.html_url);
    t.same(github.issues[0]?.labels, ['support', 'question']);
    t.equal(github.issues.length, 1);
    const mails = (await mailbox(a.mailDir)).filter((m) => m.to === SUPPORT_EMAIL);
    t.equal(mails.length, 1);
    t.ok(mails[0]?.text.includes('How do I reset a sandbox?'));
    // Closed here, before the first service's teardown removes the directory it shares.
    await b.close();
  });
}
