import type { Test } from 'tap';
import type { Mailer, MailMessage } from './mail.ts';

/** A place mail goes to, as the test reads it back. */
export interface MailDestination {
  mailer: Mailer;
  /** What `mailer.describe` must name (the directory, the SMTP host and port). */
  describes: string;
  /** Every message the destination holds, decoded, oldest first. */
  received(): Promise<MailMessage[]>;
}

/**
 * What every Mailer adapter must do (CONVENTIONS 1): deliver each message whole, resolve only
 * once the destination holds it, reject when the destination refuses it. `open` gives a fresh,
 * empty destination; `refusing` a mailer whose destination cannot take mail.
 */
export function mailerContract(t: Test, adapter: { open(): Promise<MailDestination>; refusing(): Promise<Mailer> }) {
  // Non-ASCII in every field and a link longer than a MIME line, so an adapter that encodes
  // (quoted-printable, encoded words) must decode back to exactly this.
  const link = `https://svc.example/verify-email?token=${'x'.repeat(90)}`;
  const message = (to: string, subject: string): MailMessage => ({
    to,
    subject,
    text: `Grüße! Confirm your address: ${link}\n\n— svc`,
    html: `<p>Grüße! <a href="${link}">Confirm your address</a></p>`,
  });

  t.test('send resolves once the destination holds the message, whole', async (t) => {
    const dest = await adapter.open();
    const sent = message('ada@example.com', 'Vérifiez votre adresse ✓');
    await dest.mailer.send(sent);
    t.same(await dest.received(), [sent]);
  });

  t.test('concurrent sends each arrive once', async (t) => {
    const dest = await adapter.open();
    const sent = Array.from({ length: 5 }, (_, i) => message(`user${i}@example.com`, `Message ${i}`));
    await Promise.all(sent.map((m) => dest.mailer.send(m)));
    const got = await dest.received();
    t.same(got.map((m) => m.subject).sort(), sent.map((m) => m.subject).sort());
    t.same(
      got.find((m) => m.subject === 'Message 3'),
      sent[3],
    );
  });

  t.test('messages sent one after another are listed oldest first', async (t) => {
    const dest = await adapter.open();
    const subjects = Array.from({ length: 12 }, (_, i) => `Step ${i}`);
    for (const s of subjects) await dest.mailer.send(message('ada@example.com', s));
    t.same(
      (await dest.received()).map((m) => m.subject),
      subjects,
    );
  });

  t.test('attachments arrive byte for byte, with their names and types', async (t) => {
    const dest = await adapter.open();
    // Every byte value, NUL included, and more than one MIME line of base64.
    const image = Buffer.concat([
      Buffer.from('89504e470d0a1a0a', 'hex'),
      Buffer.from(Array.from({ length: 3000 }, (_, i) => i % 256)),
    ]);
    const sent: MailMessage = {
      ...message('support@example.com', 'Support report with a screenshot'),
      attachments: [
        { filename: 'screenshot.png', contentType: 'image/png', content: image },
        { filename: 'context.json', contentType: 'application/json', content: Buffer.from('{"page":"/"}') },
      ],
    };
    await dest.mailer.send(sent);
    t.same(await dest.received(), [sent]);
  });

  t.test('send rejects when the destination refuses the message', async (t) => {
    const mailer = await adapter.refusing();
    await t.rejects(mailer.send(message('ada@example.com', 'Lost')));
  });

  t.test('describe names where mail goes', async (t) => {
    const dest = await adapter.open();
    t.ok(dest.mailer.describe.includes(dest.describes), `${dest.mailer.describe} names ${dest.describes}`);
  });
}
