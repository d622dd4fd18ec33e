/** Autonomous turns on the embedded backend (autonomous-turns-scenario.ts). */
import t from 'tap';
import { autonomousTurnsScenario } from './autonomous-turns-scenario.ts';

// Five services on embedded PGlite, each with a runner: 160 s on a loaded machine.
t.setTimeout(300_000);

autonomousTurnsScenario('embedded');
