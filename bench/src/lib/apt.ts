import { execFileSync } from 'node:child_process';

/** True when a Debian package is installed. */
export function hasPackage(name: string): boolean {
  try {
    // dpkg-query's own format syntax, not a template string.
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query format
    const out = execFileSync('dpkg-query', ['-W', '-f=${Status}', name], { stdio: ['ignore', 'pipe', 'ignore'] });
    return out.toString().includes('install ok installed');
  } catch {
    return false;
  }
}

/**
 * Installs the Debian packages a peer needs when they are absent (as root, through apt-get).
 * Throws with a plain message when that is not possible, so the scenario reports the peer as
 * not measured instead of failing silently.
 */
export function ensurePackages(names: string[], say: (s: string) => void): void {
  const missing = names.filter((n) => !hasPackage(n));
  if (missing.length === 0) return;
  if (process.getuid?.() !== 0) {
    throw new Error(`needs Debian packages ${missing.join(', ')}: run as root or apt-get install them`);
  }
  say(`installing ${missing.join(', ')} through apt-get`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  try {
    execFileSync('apt-get', ['install', '-y', '--no-install-recommends', ...missing], { env, stdio: 'ignore' });
  } catch {
    execFileSync('apt-get', ['update'], { env, stdio: 'ignore' });
    execFileSync('apt-get', ['install', '-y', '--no-install-recommends', ...missing], { env, stdio: 'ignore' });
  }
}
