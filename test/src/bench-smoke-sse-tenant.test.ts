// Smoke runs of the bench scenarios of group `sse-tenant` (bench-smoke.ts).
import { smokeScenarios } from './bench-smoke.ts';

smokeScenarios('sse-tenant');
