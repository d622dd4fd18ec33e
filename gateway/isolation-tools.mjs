// What local sandboxes need from the machine to be isolated (bubblewrap, and socat for their
// network bridges): installed with apt-get by `npm start` and `npm run demo` where they run as
// root on a Debian-like system; elsewhere one line says what to install. Plain JavaScript, as
// it runs before npm dependencies are installed.
import { execSync } from 'node:child_process';

const TOOLS = [
  { command: 'bwrap', pkg: 'bubblewrap' },
  { command: 'socat', pkg: 'socat' },
];

function haveCommand(cmd) {
  try {
    execSync(`command -v ${cmd}`, { stdio: 'ignore', shell: '/bin/sh' });
    return true;
  } catch {
    return false;
  }
}

/**
 * Installs bubblewrap and socat when SANDBOX_ISOLATION is not `none` and they are missing;
 * never throws (the service then says, at each sandbox, why it cannot isolate).
 */
export function ensureIsolationTools(env = process.env, say = (line) => process.stdout.write(`${line}\n`)) {
  if (env.SANDBOX_ISOLATION === 'none' || process.platform !== 'linux') return;
  const missing = TOOLS.filter((t) => !haveCommand(t.command)).map((t) => t.pkg);
  if (missing.length === 0) return;
  if (process.getuid?.() === 0 && haveCommand('apt-get')) {
    say(`Installing ${missing.join(' and ')} (apt-get), which isolate local sandboxes...`);
    try {
      const aptEnv = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
      execSync('apt-get update -qq', { stdio: 'inherit', env: aptEnv });
      execSync(`apt-get install -y -qq --no-install-recommends ${missing.join(' ')}`, {
        stdio: 'inherit',
        env: aptEnv,
      });
      return;
    } catch {
      // said below
    }
  }
  say(
    `svc: local sandboxes need ${missing.join(' and ')} to be isolated (Debian: apt-get install ${missing.join(' ')}); until then they are refused, unless SANDBOX_ISOLATION=none`,
  );
}
