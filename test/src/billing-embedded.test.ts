/** Billing on the embedded backend (billing-scenario.ts), and what holds on any backend. */
import t from 'tap';
import { billingScenario, paymentStartChecks } from './billing-scenario.ts';

// Payment on starts three services on embedded PGlite: 140 s on a loaded machine.
t.setTimeout(300_000);

billingScenario('embedded');
paymentStartChecks();
