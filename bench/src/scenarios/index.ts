import type { Scenario } from '../lib/scenario.ts';
import { crud } from './crud.ts';
import { replay } from './replay.ts';
import { slowWatcher } from './slow-watcher.ts';
import { sseFanout } from './sse-fanout.ts';
import { sseIdle } from './sse-idle.ts';

/** Every scenario, in the order `all` runs them and the README lists them. */
export const scenarios: Scenario[] = [crud, replay, sseIdle, sseFanout, slowWatcher];
