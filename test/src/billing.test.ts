/** Billing on Postgres and Redis (billing-scenario.ts). */
import t from 'tap';
import { billingScenario } from './billing-scenario.ts';
import { backends } from './harness.ts';

if (backends().includes('postgres+redis')) billingScenario('postgres+redis');
else t.test('billing on Postgres and Redis', { skip: 'needs TEST_DATABASE_URL (run through npm test)' }, () => {});
