import { accounts, type Sql, supportReports } from '@svc/db';
import { type IssueHost, IssueHostError, type NewIssue } from '../issues/issues.ts';
import type { Mailer, MailMessage } from '../mail/mail.ts';

type Report = supportReports.SupportReportRow;

/** Where reports go: an issue host, a mailbox, both, or neither (undefined). */
export interface ForwardDeps {
  sql: Sql;
  issues: IssueHost | undefined;
  mail: { mailer: Mailer; to: string } | undefined;
}

export interface RetryPolicy {
  /** Attempts in all; the attempt that reaches it without success ends the report `failed`. */
  maxAttempts: number;
  /** The wait after the first failed attempt; each later one waits twice the one before, up to an hour. */
  retryBaseMs: number;
}

/** GitHub refuses an issue body longer than this many characters. */
const ISSUE_BODY_MAX = 65_536;
const TITLE_WORDS = 80;

/** A fence longer than any run of backticks in `text`, so the text cannot close it early. */
function fenced(text: string, info: string): string {
  const longest = Math.max(0, ...[...text.matchAll(/`+/g)].map((m) => m[0].length));
  const fence = '`'.repeat(Math.max(3, longest + 1));
  return `${fence}${info}\n${text}\n${fence}`;
}

function titleOf(report: Report): string {
  const line =
    report.message
      .split('\n')
      .find((l) => l.trim())
      ?.trim() ?? '';
  const words = line.length > TITLE_WORDS ? `${line.slice(0, TITLE_WORDS - 1)}…` : line;
  return `[${report.category}] ${words}`;
}

function screenshotNote(report: Report, mailConfigured: boolean): string {
  if (report.screenshot_bytes === null) return 'none';
  const where = mailConfigured ? ', attached to the support mail' : '';
  return `${report.screenshot_media_type}, ${report.screenshot_bytes} bytes${where}`;
}

/**
 * The issue for a report: its category and first line as the title; its id, account, client
 * and time, then the message and the context each in a code block (so Markdown and @-mentions
 * in them stay inert), labelled `support` and the category. Only this report's own fields go in,
 * so nothing of another tenant can; the reporter's email address does not (an issue may be
 * public). A body over GitHub's limit has its context, then its message, cut with a note.
 */
export function issueOf(report: Report, mailConfigured: boolean): NewIssue {
  const head = [
    `Support report \`${report.id}\` (${report.category}) from account \`${report.account_id}\`, ${report.created_at.toISOString()}.`,
    `Client: ${report.client === null ? 'not given' : `\`${report.client.replaceAll('`', "'")}\``}. Screenshot: ${screenshotNote(report, mailConfigured)}.`,
  ].join('\n\n');
  const build = (message: string, context: string | null) =>
    [
      head,
      '### Message',
      fenced(message, 'text'),
      ...(context === null ? [] : ['### Context', fenced(context, 'json')]),
    ].join('\n\n');
  const cut = (text: string, room: number) =>
    `${text.slice(0, Math.max(0, room))}\n… (cut to fit the issue; the whole report is kept as ${report.id})`;
  let context = report.context === null ? null : JSON.stringify(report.context, null, 2);
  let body = build(report.message, context);
  if (body.length > ISSUE_BODY_MAX && context !== null) {
    context = JSON.stringify(report.context);
    body = build(report.message, context);
    if (body.length > ISSUE_BODY_MAX) {
      context = cut(context, context.length - (body.length - ISSUE_BODY_MAX) - 200);
      body = build(report.message, context);
    }
  }
  if (body.length > ISSUE_BODY_MAX) {
    body = build(cut(report.message, report.message.length - (body.length - ISSUE_BODY_MAX) - 200), context);
  }
  return { title: titleOf(report), body, labels: ['support', report.category] };
}

const escapeHtml = (s: string) =>
  s.replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;').replaceAll('"', '&quot;');

/**
 * The mail for a report, to the instance's support address: who sent it (account id and
 * email address, so support can answer), the issue when one was opened, the message and the
 * context, and the screenshot attached under its own media type.
 */
export function mailOf(
  report: Report,
  to: string,
  reporterEmail: string | null,
  screenshot: { media_type: string; bytes: Uint8Array } | undefined,
): MailMessage {
  const context = report.context === null ? null : JSON.stringify(report.context, null, 2);
  const facts = [
    `Support report ${report.id} (${report.category})`,
    `Account: ${report.account_id}${reporterEmail ? ` <${reporterEmail}>` : ''}`,
    `Client: ${report.client ?? 'not given'}`,
    `Sent: ${report.created_at.toISOString()}`,
    ...(report.issue_url ? [`Issue: ${report.issue_url}`] : []),
    `Screenshot: ${report.screenshot_bytes === null ? 'none' : 'attached'}`,
  ];
  const text = [facts.join('\n'), `Message:\n${report.message}`, ...(context ? [`Context:\n${context}`] : [])].join(
    '\n\n',
  );
  const html = [
    `<p>${facts.map(escapeHtml).join('<br>')}</p>`,
    `<h3>Message</h3><pre>${escapeHtml(report.message)}</pre>`,
    ...(context ? [`<h3>Context</h3><pre>${escapeHtml(context)}</pre>`] : []),
  ].join('\n');
  const extension = screenshot?.media_type.split('/')[1] ?? 'bin';
  return {
    to,
    subject: titleOf(report),
    text,
    html,
    ...(screenshot
      ? {
          attachments: [
            {
              filename: `screenshot-${report.id}.${extension}`,
              contentType: screenshot.media_type,
              content: Buffer.from(screenshot.bytes),
            },
          ],
        }
      : {}),
  };
}

/**
 * One forwarding attempt of a claimed report. Each destination that is configured and not yet
 * reached is tried: the issue first (so the mail can link it), then the mail. Each success is
 * recorded at once, so a later attempt (after a failure, or a worker that died) never opens a
 * second issue or sends a second mail. With every destination reached the report becomes
 * `forwarded`; otherwise it is retried after the policy's wait, and the attempt that spends
 * the last one ends it `failed`. `forward_error` says what failed, in words an operator can act
 * on, never a token. Resolves to the report's new state.
 */
export async function forwardReport(
  deps: ForwardDeps,
  report: Report,
  policy: RetryPolicy,
  now: Date,
): Promise<'forwarded' | 'retrying' | 'failed'> {
  const problems: string[] = [];
  let issueUrl = report.issue_url;
  if (deps.issues && issueUrl === null) {
    try {
      issueUrl = (await deps.issues.open(issueOf(report, deps.mail !== undefined))).url;
      await supportReports.recordIssue(deps.sql, report.id, issueUrl);
    } catch (err) {
      problems.push(
        err instanceof IssueHostError ? err.message : `Opening the issue failed: ${(err as Error).message}`,
      );
    }
  }
  if (deps.mail && report.mailed_at === null) {
    try {
      const account = await accounts.findAccountById(deps.sql, report.account_id);
      const screenshot =
        report.screenshot_bytes === null ? undefined : await supportReports.screenshotOf(deps.sql, report.id);
      await deps.mail.mailer.send(
        mailOf({ ...report, issue_url: issueUrl }, deps.mail.to, account?.email ?? null, screenshot),
      );
      await supportReports.recordMailed(deps.sql, report.id, now);
    } catch (err) {
      problems.push(`Mail to ${deps.mail.to} failed: ${(err as Error).message}`);
    }
  }
  if (problems.length === 0) {
    await supportReports.markForwarded(deps.sql, report.id, now);
    return 'forwarded';
  }
  const last = report.attempts >= policy.maxAttempts;
  const wait = Math.min(policy.retryBaseMs * 2 ** (report.attempts - 1), 3_600_000);
  const error = `${problems.join(' ')} (attempt ${report.attempts} of ${policy.maxAttempts})`.slice(0, 1000);
  await supportReports.recordFailure(deps.sql, report.id, error, last ? null : new Date(now.getTime() + wait));
  return last ? 'failed' : 'retrying';
}
