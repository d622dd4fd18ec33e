// Smoke runs of the stand-alone bench scripts, and the check that bench-smoke.ts's groups hold every scenario.
import { smokeScripts } from './bench-smoke.ts';

smokeScripts();
