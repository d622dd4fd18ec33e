import { request } from 'undici';
import { type IssueHost, IssueHostError, type NewIssue } from './issues.ts';

export interface GithubIssuesOptions {
  /** The REST API root: `https://api.github.com`, or `https://<host>/api/v3` for GitHub Enterprise Server. */
  apiUrl: string;
  /** `owner/name`. */
  repository: string;
  /** A token allowed to create issues (fine-grained: Issues read and write). */
  token: string;
  timeoutMs: number;
}

/** GitHub's error body: `{message, documentation_url, errors?}`. */
interface GithubError {
  message?: string;
  errors?: { message?: string; code?: string; field?: string }[];
}

/**
 * Opens issues through GitHub's REST API (`POST /repos/{owner}/{repo}/issues`), sending the
 * token as a bearer, the versioned JSON media type and a User-Agent (GitHub refuses requests
 * without one). GitHub sets labels only when the token's account may push to the repository
 * and silently drops them otherwise. The issue's `html_url` is the address returned; any other
 * answer than 201 (401 bad token, 404 unknown repository, 410 issues disabled, 422, 5xx) is an
 * `IssueHostError` carrying GitHub's own message.
 */
export function githubIssues(options: GithubIssuesOptions): IssueHost {
  const [owner, repo] = options.repository.split('/');
  const url = `${options.apiUrl.replace(/\/$/, '')}/repos/${encodeURIComponent(owner ?? '')}/${encodeURIComponent(repo ?? '')}/issues`;
  const describe = `GitHub ${options.repository} at ${new URL(options.apiUrl).host}`;
  return {
    describe,
    async open(issue: NewIssue) {
      let res: Awaited<ReturnType<typeof request>>;
      try {
        res = await request(url, {
          method: 'POST',
          headers: {
            accept: 'application/vnd.github+json',
            authorization: `Bearer ${options.token}`,
            'content-type': 'application/json',
            'user-agent': 'svc-support-forwarder',
            'x-github-api-version': '2022-11-28',
          },
          body: JSON.stringify({ title: issue.title, body: issue.body, labels: issue.labels }),
          signal: AbortSignal.timeout(options.timeoutMs),
          headersTimeout: options.timeoutMs,
          bodyTimeout: options.timeoutMs,
        });
      } catch (err) {
        const e = err as Error & { code?: string };
        const what =
          e.name === 'TimeoutError' || e.name === 'AbortError' ? 'did not answer in time' : 'could not be reached';
        throw new IssueHostError(`${describe} ${what} (${e.code ?? e.name}).`);
      }
      const text = await res.body.text().catch(() => '');
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        body = undefined;
      }
      if (res.statusCode === 201) {
        const htmlUrl = (body as { html_url?: unknown } | undefined)?.html_url;
        if (typeof htmlUrl !== 'string') throw new IssueHostError(`${describe} answered 201 without an html_url.`);
        return { url: htmlUrl };
      }
      const error = (body ?? {}) as GithubError;
      const detail = [error.message, ...(error.errors ?? []).map((e) => e.message ?? e.code)]
        .filter(Boolean)
        .join('; ')
        .slice(0, 300);
      throw new IssueHostError(`${describe} answered ${res.statusCode}${detail ? `: ${detail}` : ''}.`, res.statusCode);
    },
  };
}
