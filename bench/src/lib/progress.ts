/**
 * One live status line while a scenario runs: rewritten in place on a terminal, printed at
 * most every few seconds otherwise (CI logs), always to stderr so stdout stays the report.
 */
export class Progress {
  private last = 0;
  private shown = '';
  constructor(
    private readonly label: string,
    private readonly quiet = false,
  ) {}

  update(text: string): void {
    if (this.quiet) return;
    const line = `[${this.label}] ${text}`;
    if (process.stderr.isTTY) {
      process.stderr.write(`\r\x1b[K${line.slice(0, (process.stderr.columns || 120) - 1)}`);
      this.shown = line;
    } else if (Date.now() - this.last > 3000) {
      process.stderr.write(`${line}\n`);
      this.last = Date.now();
    }
  }

  /** A line that stays (a phase finished). */
  say(text: string): void {
    if (this.quiet) return;
    if (process.stderr.isTTY && this.shown) process.stderr.write('\r\x1b[K');
    process.stderr.write(`[${this.label}] ${text}\n`);
    this.shown = '';
  }

  /** A countdown of `seconds`, updated every half second with what `status` returns. */
  async countdown(seconds: number, status: () => string): Promise<void> {
    const end = Date.now() + seconds * 1000;
    while (Date.now() < end) {
      const left = Math.max(0, Math.ceil((end - Date.now()) / 1000));
      const width = 20;
      const done = Math.round(width * (1 - left / Math.max(seconds, 1)));
      this.update(`[${'#'.repeat(done)}${'.'.repeat(width - done)}] ${left}s left  ${status()}`);
      await new Promise((r) => setTimeout(r, Math.min(500, end - Date.now())));
    }
  }
}
