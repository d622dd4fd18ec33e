// Smoke runs of the bench scenarios of group `api` (bench-smoke.ts).
import { smokeScenarios } from './bench-smoke.ts';

smokeScenarios('api');
