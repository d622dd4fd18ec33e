/** Billing on the embedded backend (billing-scenario.ts), and what holds on any backend. */
import { billingScenario, paymentStartChecks } from './billing-scenario.ts';

billingScenario('embedded');
paymentStartChecks();
