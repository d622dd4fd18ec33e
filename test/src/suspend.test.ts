/** Idle local sandboxes suspended and woken, on Postgres and Redis (suspend-scenario.ts). */
import t from 'tap';
import { backends } from './harness.ts';
import { suspendScenario } from './suspend-scenario.ts';

if (backends().includes('postgres+redis')) suspendScenario('postgres+redis');
else t.test('suspend on Postgres and Redis', { skip: 'needs TEST_DATABASE_URL (run through npm test)' }, () => {});
