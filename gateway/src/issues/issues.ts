/** An issue to open: plain title, Markdown body, label names. */
export interface NewIssue {
  title: string;
  body: string;
  labels: string[];
}

/**
 * The code-host port: where support reports become issues. `open` resolves to the opened
 * issue's web address once the host has created it; it rejects with an `IssueHostError` saying
 * what the host answered (or that it did not) when it could not. It is not idempotent: every
 * call that resolves opened one issue.
 */
export interface IssueHost {
  open(issue: NewIssue): Promise<{ url: string }>;
  /** Which host and repository, for the start banner and error messages (never the token). */
  readonly describe: string;
}

/** The host refused the issue or could not be reached; `message` is fit for `forward_error`. */
export class IssueHostError extends Error {
  constructor(
    message: string,
    /** The host's HTTP status, when it answered. */
    readonly status?: number,
  ) {
    super(message);
    this.name = 'IssueHostError';
  }
}
