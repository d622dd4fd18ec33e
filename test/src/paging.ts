import type { Test } from 'tap';
import type { Client, Reply } from './harness.ts';

/** One cursor-paged list as a client sees it: `{data, meta: {limit, has_more, next_cursor}}`. */
export interface PagedList<Row> {
  http: Client;
  token: string;
  /** The list's path with any filters, without `limit` or the cursor. */
  path: string;
  /** The query parameter that takes `meta.next_cursor` (`before`, `after`). */
  cursor: string;
  limit: number;
  /** What identifies a row in `expected` (an id, a name the test gave it). */
  key: (row: Row) => string;
}

/**
 * Follows a cursor-paged list from its first page to its last and checks the paging contract:
 * every page but the last is full and says `has_more` with a cursor, the last says neither,
 * and the pages together hold exactly `expected`, each row once, in the list's order; returns
 * the rows. Tests of
 * a paged list write more rows than `limit`, across a digit boundary of their ids, so an order
 * that compares ids as text or a cursor that skips rows shows up here.
 */
export async function checkPaging<Row>(t: Test, list: PagedList<Row>, expected: string[]): Promise<Row[]> {
  const rows: Row[] = [];
  const seen: string[] = [];
  let cursor: string | number | null = null;
  // A list can have at most one page per expected row, plus an empty last page; more means
  // the cursor does not move forward.
  for (let n = 0; n <= expected.length + 1; n++) {
    const sep = list.path.includes('?') ? '&' : '?';
    const at: string = cursor === null ? '' : `&${list.cursor}=${cursor}`;
    const res: Reply = await list.http.get(`${list.path}${sep}limit=${list.limit}${at}`, { token: list.token });
    t.equal(res.status, 200, `page ${n} of ${list.path}: ${res.text.slice(0, 200)}`);
    const page = res.body.data as Row[];
    rows.push(...page);
    seen.push(...page.map(list.key));
    const meta = res.body.meta as { has_more: boolean; next_cursor: string | number | null };
    if (!meta.has_more) {
      t.equal(meta.next_cursor, null, 'the last page has no cursor');
      t.ok(page.length <= list.limit, 'the last page holds at most limit rows');
      t.same(seen, expected, `paging ${list.path} by ${list.limit} gives every row once, in order`);
      return rows;
    }
    t.equal(page.length, list.limit, `page ${n} is full while has_more is true`);
    t.not(meta.next_cursor, null, 'has_more comes with a cursor');
    cursor = meta.next_cursor;
  }
  t.fail(`paging ${list.path} did not end; rows seen: ${seen.join(', ')}`);
  return rows;
}
