import type { ApiError } from '@svc/core';
import t from 'tap';
import { z } from 'zod';
import { memoryInvalidations } from '../../gateway/src/invalidation/invalidation.memory.ts';
import { CredentialCache } from '../../gateway/src/services/credential-cache.ts';
import type { Opening, StreamResponse } from '../../gateway/src/streams/response.ts';
import { WatcherRegistry } from '../../gateway/src/streams/watchers.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { until } from './until.ts';

/** A transport's response as the registry drives it, recording what happened to it. */
function recordingResponse() {
  const r = { head: false, written: '', ended: false, error: undefined as ApiError | undefined };
  const res: StreamResponse = {
    cork: (fn) => fn(),
    writeHead: () => {
      r.head = true;
    },
    write: (chunk) => {
      r.written += chunk.toString();
      return true;
    },
    onDrain: () => {},
    end: () => {
      r.ended = true;
    },
    close: () => {
      r.ended = true;
    },
    onAborted: () => {},
    error: (e) => {
      r.error = e;
    },
  };
  return { res, r };
}

const opening = (key: string): Opening => ({
  ip: '127.0.0.1',
  authorization: `Bearer ${key}`,
  cookie: '',
  origin: '',
  lastEventId: '',
  query: new URLSearchParams(),
  admit: () => undefined,
});

t.test('the streams of an ended account end, also one whose opening was under way', async (t) => {
  const svc = await startTestService(t, { backend: primaryBackend() });
  const me = await signUp(svc);
  const other = await signUp(svc);
  const registry = new WatcherRegistry({
    sql: svc.db.sql,
    credentialCache: new CredentialCache({ ttlMs: 0, maxEntries: 1, invalidations: memoryInvalidations() }),
    log: svc.eventLog,
    logger: svc.log,
    corsOrigins: [],
    options: { heartbeatMs: 60_000, idleCloseMs: 0, maxBufferedBytes: 1 << 20 },
  });
  t.teardown(() => registry.close());
  const ran: string[] = [];
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  let preparing = 0;
  const open = (key: string, checks: { prepare?: () => Promise<void> } = {}) => {
    const { res, r } = recordingResponse();
    registry.open(
      res,
      opening(key),
      z.object({ last_event_id: z.string().optional() }),
      async ({ w, principal }) => {
        ran.push(principal.accountId);
        w.following = { stop: () => {} };
      },
      checks,
    );
    return r;
  };
  const waiting = {
    prepare: () => {
      preparing++;
      return gate;
    },
  };

  const open1 = open(me.key);
  await until('the first stream is open', () => ran.includes(me.accountId));
  const opening1 = open(me.key, waiting);
  const opening2 = open(other.key, waiting);
  await until('both openings are past authentication', () => preparing === 2);

  t.equal(registry.endAccount(me.accountId), 1, 'the open stream of the account is ended at once');
  t.ok(open1.ended);
  release();
  await until('the other account’s stream runs', () => ran.includes(other.accountId));
  await until('the account’s opening stream is ended as it joins', () => opening1.ended);
  t.ok(opening1.head, 'it had answered 200 (its credential held when it was checked)');
  t.same(
    ran.filter((a) => a === me.accountId),
    [me.accountId],
    'the ended opening never started its stream',
  );
  t.notOk(opening2.ended, 'another account’s stream stays open');
  t.equal(registry.size, 1);

  const later = open(me.key);
  await until('a stream opened after the end', () => ran.filter((a) => a === me.accountId).length === 2);
  t.notOk(later.ended, 'is not ended by it (the account here was not suspended)');
});
