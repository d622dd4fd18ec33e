import { monotonicFactory } from 'ulid';

const nextUlid = monotonicFactory();

/**
 * Resource ids: a short type prefix and a ULID (`acc_01J...`). Sortable by creation time, so
 * newest-first lists can order by id; the prefix tells a reader what an id names.
 */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${nextUlid().toLowerCase()}`;
}

export type IdPrefix =
  | 'acc'
  | 'key'
  | 'ses'
  | 'tok'
  | 'aud'
  | 'spt'
  | 'agt'
  | 'env'
  | 'vlt'
  | 'sec'
  | 'cnv'
  | 'trn'
  | 'rnr'
  | 'sbx'
  | 'sch'
  | 'sup'
  | 'whe'
  | 'whj'
  | 'whd'
  | 'exp'
  | 'sbd';
