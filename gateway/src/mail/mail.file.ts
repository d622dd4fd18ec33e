import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { newId } from '@svc/core';
import type { Mailer, MailMessage } from './mail.ts';

/**
 * Writes each message as one JSON file `{to, subject, text, html}` into `dir`, named so that
 * a directory listing sorts oldest first. The file appears atomically (write, then rename).
 * Attachments are kept as `attachments: [{filename, contentType, content}]` with `content` in
 * base64 (`readMailFile` reads a file back into the message that was sent).
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
      const { attachments, ...rest } = message;
      const stored = attachments?.length
        ? { ...rest, attachments: attachments.map((a) => ({ ...a, content: a.content.toString('base64') })) }
        : rest;
      await writeFile(tmp, `${JSON.stringify(stored, null, 2)}\n`, { mode: 0o600 });
      await rename(tmp, join(abs, name));
    },
  };
}

/** One file the file mailer wrote, as the message that was sent (attachments decoded). */
export async function readMailFile(path: string): Promise<MailMessage> {
  const stored = JSON.parse(await readFile(path, 'utf8')) as Omit<MailMessage, 'attachments'> & {
    attachments?: { filename: string; contentType: string; content: string }[];
  };
  const { attachments, ...rest } = stored;
  if (!attachments) return rest;
  return { ...rest, attachments: attachments.map((a) => ({ ...a, content: Buffer.from(a.content, 'base64') })) };
}
