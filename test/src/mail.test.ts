import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import PostalMime from 'postal-mime';
import { SMTPServer, type SMTPServerOptions } from 'smtp-server';
import t, { type Test } from 'tap';
import { mailerContract } from '../../gateway/src/mail/mail.contract.ts';
import { fileMailer, readMailFile } from '../../gateway/src/mail/mail.file.ts';
import { smtpMailer } from '../../gateway/src/mail/mail.smtp.ts';
import type { MailMessage } from '../../gateway/src/mail/mail.ts';

t.test('file mailer contract', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'svc-mail-'));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  let n = 0;
  mailerContract(t, {
    async open() {
      const dir = join(root, `box${++n}`);
      return {
        mailer: fileMailer(dir),
        describes: dir,
        async received() {
          const names = (await readdir(dir)).filter((f) => f.endsWith('.json')).sort();
          return Promise.all(names.map((f) => readMailFile(join(dir, f))));
        },
      };
    },
    async refusing() {
      // The directory would have to live under a regular file: it cannot be made.
      const file = join(root, `plain${++n}`);
      await writeFile(file, '');
      return fileMailer(join(file, 'mail'));
    },
  });
});

/** A real SMTP server on a free local port; what it accepted, decoded, in arrival order. */
async function startSmtpServer(t: Test, options: SMTPServerOptions = {}) {
  const received: MailMessage[] = [];
  const server = new SMTPServer({
    // Plain SMTP on loopback: no STARTTLS to negotiate with a self-signed certificate.
    disabledCommands: ['STARTTLS'],
    allowInsecureAuth: true,
    onAuth(auth, _session, done) {
      if (auth.username === 'svc' && auth.password === 'mail-secret') done(null, { user: auth.username });
      else done(new Error('Invalid username or password'));
    },
    onData(stream, _session, done) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        PostalMime.parse(Buffer.concat(chunks)).then((m) => {
          const message: MailMessage = {
            to: m.to?.[0]?.address ?? '',
            subject: m.subject ?? '',
            // A MIME body part ends with a line break that is not part of the content.
            text: (m.text ?? '').replace(/\r?\n$/, ''),
            html: (m.html ?? '').replace(/\r?\n$/, ''),
          };
          if (m.attachments.length) {
            message.attachments = m.attachments.map((a) => ({
              filename: a.filename ?? '',
              contentType: a.mimeType,
              content: Buffer.from(a.content as ArrayBuffer),
            }));
          }
          received.push(message);
          done();
        }, done);
      });
    },
    ...options,
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const { port } = server.server.address() as AddressInfo;
  return { port, received };
}

t.test('smtp mailer contract, against a real SMTP server with authentication', async (t) => {
  mailerContract(t, {
    async open() {
      const server = await startSmtpServer(t);
      const mailer = smtpMailer(`smtp://svc:mail-secret@127.0.0.1:${server.port}`, 'svc <no-reply@svc.example>');
      t.teardown(() => mailer.close());
      return { mailer, describes: `127.0.0.1:${server.port}`, received: async () => [...server.received] };
    },
    async refusing() {
      const server = await startSmtpServer(t, {
        onRcptTo(_address, _session, done) {
          done(new Error('mailbox unavailable'));
        },
      });
      const mailer = smtpMailer(`smtp://svc:mail-secret@127.0.0.1:${server.port}`, 'svc <no-reply@svc.example>');
      t.teardown(() => mailer.close());
      return mailer;
    },
  });
});
