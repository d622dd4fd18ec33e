/** Autonomous turns on the embedded backend (autonomous-turns-scenario.ts). */
import { autonomousTurnsScenario } from './autonomous-turns-scenario.ts';

autonomousTurnsScenario('embedded');
