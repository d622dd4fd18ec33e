import {
  ApiError,
  AVATAR_TYPES,
  newId,
  orNotFound,
  SUPPORT_CONTEXT_MAX_BYTES,
  SUPPORT_MESSAGE_MAX_BYTES,
  SUPPORT_SCREENSHOT_MAX_BYTES,
  type SupportReportCreate,
  sniffImage,
  tooLarge,
} from '@svc/core';
import { type Sql, supportReports, transaction } from '@svc/db';
import type { z } from 'zod';
import type { Keyring } from '../secrets/keyring.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';
import { reportScrubber } from './support-secrets.ts';

/** A report as the API shows it: that a screenshot exists, its type and size, never its bytes. */
export function shapeReport(row: supportReports.SupportReportRow) {
  return {
    id: row.id,
    category: row.category,
    status: row.status,
    message: row.message,
    context: row.context,
    client: row.client,
    screenshot:
      row.screenshot_media_type === null || row.screenshot_bytes === null
        ? null
        : { media_type: row.screenshot_media_type, bytes: row.screenshot_bytes },
    forwarded_at: row.forwarded_at?.toISOString() ?? null,
    external_url: row.issue_url,
    forward_error: row.forward_error,
    created_at: row.created_at.toISOString(),
  };
}

/**
 * The screenshot decoded and judged by its bytes: at most 5 MB (413), and a png, jpeg, gif or
 * webp whose signature agrees with the declared type (415), whatever the label says.
 */
function decodeScreenshot(screenshot: { data: string; media_type: string }) {
  const bytes = Buffer.from(screenshot.data, 'base64');
  if (bytes.length > SUPPORT_SCREENSHOT_MAX_BYTES) {
    throw tooLarge('screenshot', SUPPORT_SCREENSHOT_MAX_BYTES, bytes.length);
  }
  const declared = screenshot.media_type.split(';')[0]?.trim().toLowerCase() ?? '';
  const sniffed = sniffImage(bytes);
  if (!sniffed) {
    throw new ApiError('unsupported_media_type', `screenshot is not an image of ${AVATAR_TYPES.join(', ')}.`);
  }
  if (sniffed !== declared) {
    throw new ApiError('unsupported_media_type', `screenshot is ${sniffed}, not ${screenshot.media_type}.`);
  }
  return { mediaType: sniffed, bytes };
}

/**
 * Stores a report, `new`, for the forwarder to take. Refused with 413 naming the field when
 * the message, the context or the screenshot is over its limit, and 415 when the screenshot's
 * bytes are not the image type declared. Secrets the reporter pasted are replaced before
 * anything is stored (`reportScrubber`). Audited as `support.report.created` with the
 * category, the sizes and the context's keys; never the message.
 */
export async function createReport(
  deps: { sql: Sql; keyring: Keyring },
  who: ActorRef,
  body: z.infer<typeof SupportReportCreate>,
) {
  const messageBytes = Buffer.byteLength(body.message, 'utf8');
  if (messageBytes > SUPPORT_MESSAGE_MAX_BYTES) {
    throw tooLarge('message', SUPPORT_MESSAGE_MAX_BYTES, messageBytes);
  }
  const contextBytes = body.context === undefined ? 0 : Buffer.byteLength(JSON.stringify(body.context), 'utf8');
  if (contextBytes > SUPPORT_CONTEXT_MAX_BYTES) {
    throw tooLarge('context (as JSON)', SUPPORT_CONTEXT_MAX_BYTES, contextBytes);
  }
  const screenshot = body.screenshot ? decodeScreenshot(body.screenshot) : null;
  const scrub = await reportScrubber(deps, who.accountId);
  const context = body.context === undefined ? null : scrub.context(body.context);
  const id = newId('sup');
  const row = await transaction(deps.sql, async (tx) => {
    const inserted = await supportReports.insertReport(tx, {
      id,
      accountId: who.accountId,
      category: body.category,
      message: scrub.text(body.message),
      context,
      client: body.client ? scrub.text(body.client) : null,
      screenshot,
    });
    await recordAudit(
      tx,
      who,
      'support.report.created',
      { type: 'support_report', id },
      {
        category: body.category,
        message_bytes: messageBytes,
        context_bytes: contextBytes,
        context_keys: Object.keys(context ?? {}).sort(),
        screenshot_bytes: screenshot?.bytes.length ?? null,
        screenshot_media_type: screenshot?.mediaType ?? null,
      },
    );
    return inserted;
  });
  return shapeReport(row);
}

export async function listReports(sql: Sql, accountId: string) {
  return (await supportReports.listReports(sql, accountId)).map(shapeReport);
}

/** The caller's report; another account's id answers 404 exactly as an unknown one. */
export async function getReport(sql: Sql, accountId: string, id: string) {
  return shapeReport(orNotFound(await supportReports.getReport(sql, accountId, id), 'Support report'));
}
