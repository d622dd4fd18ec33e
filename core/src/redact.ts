/**
 * Redaction of secret values in output (SPEC: every value of 8 bytes or more placed in a
 * sandbox environment is replaced by `[REDACTED]`). Pure; the log's `append` is its only
 * caller, so there is one write path and redaction happens there and nowhere else.
 *
 * A value may arrive split across chunks of one stream, so a `StreamRedactor` holds back the
 * end of a chunk while it could still be the start of a secret, and emits it with the next
 * chunk (or on `flush`). It also matches each value as it appears JSON-escaped, since ACP
 * payloads carry output inside JSON strings (DECISIONS).
 */
export const REDACTED = '[REDACTED]';
export const MIN_SECRET_BYTES = 8;

/** The forms a value can take in output: as is, and escaped inside a JSON string. */
function formsOf(value: string): string[] {
  const escaped = JSON.stringify(value).slice(1, -1);
  return escaped === value ? [value] : [value, escaped];
}

export class SecretSet {
  /** Longest first, so a secret containing another is replaced whole. */
  readonly patterns: string[];
  readonly longest: number;

  constructor(values: Iterable<string>) {
    const set = new Set<string>();
    for (const v of values) {
      if (Buffer.byteLength(v, 'utf8') < MIN_SECRET_BYTES) continue;
      for (const f of formsOf(v)) set.add(f);
    }
    this.patterns = [...set].sort((a, b) => b.length - a.length);
    this.longest = this.patterns[0]?.length ?? 0;
  }

  get empty(): boolean {
    return this.patterns.length === 0;
  }

  /** Replaces every occurrence of every pattern in a complete text. */
  redact(text: string): string {
    if (this.empty) return text;
    let out = text;
    for (const p of this.patterns) if (out.includes(p)) out = out.split(p).join(REDACTED);
    return out;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some pattern. */
  pendingSuffix(text: string): number {
    const max = Math.min(text.length, this.longest - 1);
    for (let len = max; len > 0; len--) {
      const tail = text.slice(text.length - len);
      if (this.patterns.some((p) => p.length > len && p.startsWith(tail))) return len;
    }
    return 0;
  }
}

/** Redacts one stream of chunks (one conversation's stdout, say), across chunk boundaries. */
export class StreamRedactor {
  private held = '';

  constructor(private secrets: SecretSet) {}

  /**
   * Redacts with `secrets` from now on: a set that grew (a conversation's next turn brought
   * values). What is held back stays held until the next chunk decides it.
   */
  use(secrets: SecretSet): void {
    this.secrets = secrets;
  }

  /** The redacted text that is safe to emit now; a possible secret start is held back. */
  push(chunk: string): string {
    if (this.secrets.empty) return chunk;
    const text = this.secrets.redact(this.held + chunk);
    const keep = this.secrets.pendingSuffix(text);
    this.held = text.slice(text.length - keep);
    return text.slice(0, text.length - keep);
  }

  /** Whatever is held back, redacted; call when the stream ends or pauses (end of turn). */
  flush(): string {
    const out = this.secrets.redact(this.held);
    this.held = '';
    return out;
  }

  get holding(): boolean {
    return this.held.length > 0;
  }

  /** What is held back now, unredacted (to carry it to another process: `hold`). */
  get heldText(): string {
    return this.held;
  }

  /** Holds `text` back from now on, in place of what was held (another process's `heldText`). */
  hold(text: string): void {
    this.held = text;
  }
}
