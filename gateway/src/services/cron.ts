import { validationFailed } from '@svc/core';
import { CronExpressionParser } from 'cron-parser';

/** The named forms accepted besides five fields (`@reboot` has no slot in time, so it is not one). */
const NAMED = new Set(['@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight', '@hourly']);

/**
 * The first slot of `cron` strictly after `after`, evaluated in UTC. `cron` is five fields
 * (minute hour day-of-month month day-of-week) or a name in the `@daily` style. Anything else
 * (six fields, `@reboot`, a value out of range, a date that never occurs) throws 422
 * `validation_failed` with the reason under `details.cron`.
 */
export function nextSlot(cron: string, after: Date): Date {
  const text = cron.trim();
  if (text.startsWith('@')) {
    if (text.toLowerCase() === '@reboot') throw invalid('@reboot is not supported: a schedule needs a time');
    if (!NAMED.has(text.toLowerCase())) throw invalid(`unknown name ${text}; use one of ${[...NAMED].join(', ')}`);
  } else if (text.split(/\s+/).length !== 5) {
    throw invalid('must have 5 fields (minute hour day-of-month month day-of-week) or be a name such as @daily');
  }
  try {
    return CronExpressionParser.parse(text.startsWith('@') ? text.toLowerCase() : text, {
      tz: 'UTC',
      currentDate: after,
    })
      .next()
      .toDate();
  } catch (err) {
    throw invalid((err as Error).message);
  }
}

const invalid = (message: string) => validationFailed({ cron: [message] });
