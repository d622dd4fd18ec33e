/** A file sent with a message, delivered byte for byte under its name and media type. */
export interface MailAttachment {
  filename: string;
  contentType: string;
  content: Buffer;
}

/** One outgoing message. `text` carries every link in full, so a plain-text reader can follow it. */
export interface MailMessage {
  to: string;
  subject: string;
  text: string;
  html: string;
  /** Absent or empty: a message without files. */
  attachments?: MailAttachment[];
}

/**
 * The mail port. `send` resolves once the transport has accepted the message (written the
 * file, or the SMTP server answered 250); it rejects when it could not. Callers that must not
 * reveal an address's existence send in the background and log failures instead of answering
 * them.
 */
export interface Mailer {
  send(message: MailMessage): Promise<void>;
  /** Where mail goes, for the start banner: a directory or an SMTP host. */
  readonly describe: string;
}
