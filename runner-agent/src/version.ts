import { readFileSync } from 'node:fs';

/** This runner-agent's package version (its hello says it; so does `svc-runner --version`). */
export const AGENT_VERSION = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;
