import nodemailer from 'nodemailer';
import type { Mailer, MailMessage } from './mail.ts';

/** Sends through an SMTP server given as `smtp://user:pass@host:port` (or `smtps://`). */
export function smtpMailer(smtpUrl: string, from: string): Mailer & { close(): void } {
  const transport = nodemailer.createTransport(smtpUrl);
  const host = new URL(smtpUrl).host;
  return {
    describe: `smtp ${host}`,
    async send(message: MailMessage) {
      const { attachments, ...rest } = message;
      await transport.sendMail({
        from,
        ...rest,
        ...(attachments?.length
          ? {
              attachments: attachments.map((a) => ({
                filename: a.filename,
                contentType: a.contentType,
                content: a.content,
              })),
            }
          : {}),
      });
    },
    close: () => transport.close(),
  };
}
