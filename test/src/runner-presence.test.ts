/** Runner presence on /api/team/stream, on Postgres and Redis (runner-presence-scenario.ts). */
import t from 'tap';
import { backends } from './harness.ts';
import { runnerPresenceScenario } from './runner-presence-scenario.ts';

if (backends().includes('postgres+redis')) runnerPresenceScenario('postgres+redis');
else
  t.test('runner presence on Postgres and Redis', { skip: 'needs TEST_DATABASE_URL (run through npm test)' }, () => {});
