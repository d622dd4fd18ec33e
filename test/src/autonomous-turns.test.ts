/** Autonomous turns on Postgres and Redis (autonomous-turns-scenario.ts). */
import t from 'tap';
import { autonomousTurnsScenario } from './autonomous-turns-scenario.ts';
import { backends } from './harness.ts';

if (backends().includes('postgres+redis')) autonomousTurnsScenario('postgres+redis');
else
  t.test(
    'autonomous turns on Postgres and Redis',
    { skip: 'needs TEST_DATABASE_URL (run through npm test)' },
    () => {},
  );
