/**
 * A local stand-in for GitHub's REST API, issues only (`POST /repos/{owner}/{repo}/issues`),
 * speaking its wire format: a token as `Authorization: Bearer <t>` (or the older `token <t>`),
 * a refused request without a User-Agent (403, plain text, as GitHub answers it), an
 * unsupported `X-GitHub-Api-Version` (400), GitHub's JSON error bodies `{message,
 * documentation_url, status}` for a missing or bad token (401), an unknown repository (404),
 * a missing title or a body over 65,536 characters (422), and on success 201 with a
 * `Location` header and the issue object (`number`, `html_url`, `labels` as objects, ...).
 * `failNext(n, status)` makes the next `n` requests answer `status`, for failure paths.
 */
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface OpenedIssue {
  owner: string;
  repo: string;
  number: number;
  title: string;
  body: string;
  labels: string[];
  html_url: string;
  /** The request's headers, as GitHub would see them. */
  headers: Record<string, string | string[] | undefined>;
}

export interface FakeGithub {
  url: string;
  /** Issues opened, oldest first. */
  issues: OpenedIssue[];
  /** Requests answered, including refused ones. */
  requests: number;
  /** The next `count` requests answer `status` with GitHub's error body. */
  failNext(count: number, status: number): void;
  close(): Promise<void>;
}

const DOCS = 'https://docs.github.com/rest/issues/issues#create-an-issue';

export async function startFakeGithub(options: { token: string; repositories: string[] }): Promise<FakeGithub> {
  const issues: OpenedIssue[] = [];
  const numbers = new Map<string, number>();
  let failing = { count: 0, status: 0 };
  let requests = 0;
  const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
    res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
    res.end(JSON.stringify(body));
  };
  const error = (res: ServerResponse, status: number, message: string, extra: Record<string, unknown> = {}) =>
    json(res, status, { message, ...extra, documentation_url: DOCS, status: String(status) });

  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      requests++;
      if (failing.count > 0) {
        failing.count--;
        const messages: Record<number, string> = {
          500: 'Server Error',
          502: 'Server Error',
          503: 'Service Unavailable',
          403: 'API rate limit exceeded for installation.',
        };
        return error(res, failing.status, messages[failing.status] ?? 'Server Error');
      }
      if (!req.headers['user-agent']) {
        res.writeHead(403, { 'content-type': 'text/plain' });
        return res.end(
          'Request forbidden by administrative rules. Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). Check https://developer.github.com for other possible causes.\n',
        );
      }
      const version = req.headers['x-github-api-version'];
      if (version !== undefined && version !== '2022-11-28') {
        return error(res, 400, `API version ${String(version)} is not supported.`);
      }
      const match = /^\/repos\/([^/]+)\/([^/]+)\/issues$/.exec(req.url ?? '');
      if (!match || req.method !== 'POST') return error(res, 404, 'Not Found');
      const auth = /^(?:Bearer|token) (.+)$/i.exec(req.headers.authorization ?? '');
      if (!auth) return error(res, 401, 'Requires authentication');
      if (auth[1] !== options.token) return error(res, 401, 'Bad credentials');
      const [, owner, repo] = match as unknown as [string, string, string];
      if (!options.repositories.includes(`${owner}/${repo}`)) return error(res, 404, 'Not Found');
      let payload: { title?: unknown; body?: unknown; labels?: unknown };
      try {
        payload = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        return error(res, 400, 'Problems parsing JSON');
      }
      if (typeof payload.title !== 'string' || payload.title === '') {
        return error(res, 422, 'Invalid request.\n\n"title" wasn\'t supplied.');
      }
      const body = typeof payload.body === 'string' ? payload.body : '';
      if (body.length > 65_536) {
        return error(res, 422, 'Validation Failed', {
          errors: [
            {
              resource: 'Issue',
              code: 'custom',
              field: 'body',
              message: 'body is too long (maximum is 65536 characters)',
            },
          ],
        });
      }
      const labels = Array.isArray(payload.labels) ? payload.labels.map(String) : [];
      const key = `${owner}/${repo}`;
      const number = (numbers.get(key) ?? 0) + 1;
      numbers.set(key, number);
      const apiBase = `http://${req.headers.host}/repos/${owner}/${repo}`;
      const html_url = `https://github.example/${owner}/${repo}/issues/${number}`;
      issues.push({ owner, repo, number, title: payload.title, body, labels, html_url, headers: req.headers });
      const now = new Date().toISOString();
      json(
        res,
        201,
        {
          id: 1_000_000 + issues.length,
          node_id: `I_kwDO${number}`,
          url: `${apiBase}/issues/${number}`,
          repository_url: apiBase,
          labels_url: `${apiBase}/issues/${number}/labels{/name}`,
          comments_url: `${apiBase}/issues/${number}/comments`,
          events_url: `${apiBase}/issues/${number}/events`,
          html_url,
          number,
          state: 'open',
          title: payload.title,
          body,
          user: { login: 'svc-support', id: 1, type: 'Bot' },
          labels: labels.map((name, i) => ({
            id: i + 1,
            node_id: `LA_${i + 1}`,
            url: `${apiBase}/labels/${encodeURIComponent(name)}`,
            name,
            color: 'ededed',
            default: false,
            description: null,
          })),
          assignee: null,
          assignees: [],
          milestone: null,
          locked: false,
          comments: 0,
          created_at: now,
          updated_at: now,
          closed_at: null,
          author_association: 'OWNER',
        },
        { location: `${apiBase}/issues/${number}` },
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    issues,
    get requests() {
      return requests;
    },
    failNext(count, status) {
      failing = { count, status };
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
