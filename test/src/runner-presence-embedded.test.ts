/** Runner presence on /api/team/stream, on the embedded backend (runner-presence-scenario.ts). */
import { runnerPresenceScenario } from './runner-presence-scenario.ts';

runnerPresenceScenario('embedded');
