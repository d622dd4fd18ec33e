import { mkdir, rename, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { newId } from '@svc/core';
import type { Mailer, MailMessage } from './mail.ts';

/**
 * Writes each message as one JSON file `{to, subject, text, html}` into `dir`, named so that
 * a directory listing sorts oldest first. The file appears atomically (write, then rename).
 */
export function fileMailer(dir: string): Mailer {
  const abs = resolve(dir);
  let ready: Promise<unknown> | undefined;
  return {
    describe: abs,
    async send(message: MailMessage) {
      ready ??= mkdir(abs, { recursive: true });
      await ready;
      const name = `${newId('tok').slice(4)}.json`;
      const tmp = join(abs, `.${name}.tmp`);
      await writeFile(tmp, `${JSON.stringify(message, null, 2)}\n`, { mode: 0o600 });
      await rename(tmp, join(abs, name));
    },
  };
}
