// The Docker image, checked from its Dockerfile without a Docker engine: what it copies exists
// and is not ignored, the `npm ci` of its build stage installs the agent CLIs the service's
// default runtime commands name, the final stage keeps every node_modules that install makes,
// and it installs what the `local` sandbox provider runs (git, bubblewrap, socat).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { commandLine, RUNTIMES } from '@svc/core';
import { loadConfig } from '@svc/gateway';
import t from 'tap';

const REPO = fileURLToPath(new URL('../../', import.meta.url));

/** The Dockerfile's instructions, continuation lines joined, comments dropped, split by stage. */
function stages(): string[][] {
  const lines = readFileSync(join(REPO, 'Dockerfile'), 'utf8')
    .split('\n')
    .filter((l) => !/^\s*#/.test(l))
    .join('\n')
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);
  const out: string[][] = [];
  for (const line of lines) {
    if (/^FROM\s/i.test(line)) out.push([]);
    out.at(-1)?.push(line);
  }
  return out;
}

/** What `.dockerignore` leaves out of the build context, as a test on a path of it. */
function ignored(): (path: string) => boolean {
  const patterns = readFileSync(join(REPO, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  // `**` is any number of directories, `*` any run of characters but `/`; a match takes what is below it.
  const res = patterns.map((pattern) => {
    const parts = pattern.replace(/^\//, '').replace(/\/$/, '').split('/');
    const body = parts
      .map((part, i) =>
        part === '**'
          ? '(?:.*/)?'
          : `${part.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*')}${i < parts.length - 1 ? '/' : ''}`,
      )
      .join('');
    return new RegExp(`^${body}(?:/|$)`);
  });
  return (path) => res.some((re) => re.test(path.replace(/^\.\//, '').replace(/\/$/, '')));
}

interface LockPackage {
  link?: boolean;
  resolved?: string;
  bin?: Record<string, string> | string;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
}

/**
 * The lockfile locations `npm ci --omit=dev` installs for `roots` (workspace directories, and
 * "" for the root itself): each root's dependencies, followed through node's lookup of
 * `node_modules` from the dependent's location upwards, workspace links to their directory.
 */
function installed(lock: Record<string, LockPackage>, roots: string[]): Set<string> {
  const seen = new Set<string>();
  const visit = (location: string) => {
    if (seen.has(location)) return;
    seen.add(location);
    const pkg = lock[location];
    if (!pkg) return;
    if (pkg.link && pkg.resolved !== undefined) return visit(pkg.resolved);
    const peers = Object.keys(pkg.peerDependencies ?? {}).filter((n) => !pkg.peerDependenciesMeta?.[n]?.optional);
    for (const name of [
      ...Object.keys(pkg.dependencies ?? {}),
      ...Object.keys(pkg.optionalDependencies ?? {}),
      ...peers,
    ]) {
      let dir = location;
      for (;;) {
        const candidate = `${dir ? `${dir}/` : ''}node_modules/${name}`;
        if (lock[candidate]) {
          visit(candidate);
          break;
        }
        if (!dir) break;
        // Up one package: past its own `node_modules/<name>` (or `<scope>/<name>`), or out of a workspace.
        const at = dir.lastIndexOf('/node_modules/');
        dir = at >= 0 ? dir.slice(0, at) : '';
      }
    }
  };
  for (const root of roots) visit(root);
  return seen;
}

const all = stages();
const build = all[0] ?? [];
const final = all.at(-1) ?? [];

t.test('every path the Dockerfile copies from the build context exists and is not ignored', async (t) => {
  const isIgnored = ignored();
  t.ok(isIgnored('gateway/node_modules') && isIgnored('.git') && !isIgnored('gateway'), 'ignore patterns are read');
  const copies = all.flat().filter((l) => /^COPY\s/i.test(l) && !/--from=/.test(l));
  t.ok(copies.length > 5, `the Dockerfile copies from the context: ${copies.length} COPY lines`);
  for (const line of copies) {
    const parts = line
      .split(/\s+/)
      .slice(1)
      .filter((p) => !p.startsWith('--'));
    for (const source of parts.slice(0, -1)) {
      t.ok(existsSync(join(REPO, source)), `${source} exists (${line})`);
      t.notOk(isIgnored(source), `${source} is not left out by .dockerignore`);
    }
  }
});

t.test("the image's npm ci installs the agent CLI of every default runtime command", async (t) => {
  const ci = build.find((l) => /\bnpm ci\b/.test(l)) ?? '';
  t.match(ci, /--omit=dev/, 'the build stage installs production dependencies');
  const workspaces = [...ci.matchAll(/--workspace[= ](\S+)/g)].map((m) => m[1] as string);
  const roots = [...workspaces, ...(/--include-workspace-root/.test(ci) ? [''] : [])];
  t.ok(workspaces.includes('gateway'), `it installs the gateway's (${workspaces.join(', ')})`);
  const lock = JSON.parse(readFileSync(join(REPO, 'package-lock.json'), 'utf8')).packages as Record<
    string,
    LockPackage
  >;
  const made = installed(lock, roots);
  // Where npm links bins for every local runner-agent's PATH: node_modules/.bin (provider.local.ts).
  const bins = new Map<string, string>();
  for (const location of made) {
    const bin = lock[location]?.bin;
    if (!bin || !/^node_modules\/(@[^/]+\/)?[^/]+$/.test(location)) continue;
    const name = location.slice('node_modules/'.length);
    for (const b of typeof bin === 'string' ? [name.split('/').at(-1) as string] : Object.keys(bin)) bins.set(b, name);
  }
  const config = loadConfig({});
  for (const runtime of RUNTIMES) {
    const line = config[`RUNTIME_${runtime.toUpperCase()}_COMMAND` as keyof typeof config] as string;
    const { command } = commandLine(line);
    t.ok(bins.has(command), `${runtime}: ${command} is in the image's node_modules/.bin (from ${bins.get(command)})`);
  }

  // The final stage keeps all of it: each installed location lies under a path copied from the build stage.
  const kept = final
    .filter((l) => /^COPY\s+--from=/i.test(l))
    .flatMap((l) => l.split(/\s+/).slice(2, -1))
    .map((p) => p.replace(/\/$/, ''));
  const lost = [...made].filter((loc) => lock[loc] && !kept.some((k) => `/app/${loc}`.startsWith(`${k}/`)));
  t.same(lost, [], 'every node_modules the install makes is copied into the image (none left behind)');
});

t.test('the image holds what local sandboxes run: git, bubblewrap and socat', async (t) => {
  const apt = final.find((l) => /apt-get install/.test(l)) ?? '';
  for (const pkg of ['git', 'ca-certificates', 'bubblewrap', 'socat']) {
    t.match(apt, new RegExp(`\\s${pkg}(\\s|$)`), `apt-get installs ${pkg}`);
  }
  t.match(final.find((l) => /^ENTRYPOINT/.test(l)) ?? '', /\["node", "gateway\/start\.mjs"\]/, 'started with node');
});
