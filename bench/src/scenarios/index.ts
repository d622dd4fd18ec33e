import type { Scenario } from '../lib/scenario.ts';
import { crud } from './crud.ts';
import { embedded } from './embedded.ts';
import { ingest } from './ingest.ts';
import { metrics } from './metrics.ts';
import { replay } from './replay.ts';
import { runners } from './runners.ts';
import { scaling } from './scaling.ts';
import { slowWatcher } from './slow-watcher.ts';
import { sseCeiling } from './sse-ceiling.ts';
import { sseFanout, sseTenant } from './sse-fanout.ts';
import { sseIdle } from './sse-idle.ts';
import { webhookConsume } from './webhook-consume.ts';

/** Every scenario, in the order `all` runs them and the README lists them. */
export const scenarios: Scenario[] = [
  sseIdle,
  sseFanout,
  sseTenant,
  ingest,
  replay,
  crud,
  runners,
  slowWatcher,
  scaling,
  sseCeiling,
  metrics,
  webhookConsume,
  embedded,
];
