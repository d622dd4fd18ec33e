// Smoke runs of the bench scenarios of group `log` (bench-smoke.ts).
import { smokeScenarios } from './bench-smoke.ts';

smokeScenarios('log');
