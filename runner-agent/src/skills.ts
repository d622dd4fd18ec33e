import { randomUUID } from 'node:crypto';
import { cp, mkdir, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { gitClone } from './clone.ts';
import type { Confine } from './isolation.ts';
import type { OnOutput } from './run-streamed.ts';

export type SkillSpec = { name: string; content: string } | { source: string; ref?: string | undefined };

/**
 * Where skills go: `.claude/skills/<name>/SKILL.md` under the sandbox's HOME (the sandbox
 * directory), where Claude Code finds personal skills. Other runtimes do not read skills yet.
 */
export function skillsDir(dir: string): string {
  return join(dir, '.claude', 'skills');
}

/** Writes each `{name, content}` skill verbatim as `<skills>/<name>/SKILL.md`. */
export async function writeInlineSkills(dir: string, skills: SkillSpec[]): Promise<void> {
  for (const s of skills) {
    if (!('name' in s)) continue;
    if (!/^[a-z0-9][a-z0-9-]{0,63}$/.test(s.name)) throw new Error(`skill name ${JSON.stringify(s.name)} is not valid`);
    const at = join(skillsDir(dir), s.name);
    await mkdir(at, { recursive: true });
    await writeFile(join(at, 'SKILL.md'), s.content);
  }
}

/**
 * The git URL of a skill source: a URL as given, or GitHub's `owner/repo` shorthand.
 */
export function skillSourceUrl(source: string): string {
  if (/^[A-Za-z0-9_.-]+\/[A-Za-z0-9_.-]+$/.test(source)) return `https://github.com/${source}.git`;
  return source;
}

/**
 * Installs a `{source, ref?}` skill: the repository is cloned (shallow, at `ref`) and the skill
 * is its root when that holds a SKILL.md (named after the repository), otherwise every directory
 * `<x>/SKILL.md` or `skills/<x>/SKILL.md` in it (named `<x>`). A source with no SKILL.md fails.
 */
export async function installSkillSource(
  dir: string,
  skill: { source: string; ref?: string | undefined },
  env: Record<string, string>,
  onOutput: OnOutput,
  confine?: Confine,
): Promise<string[]> {
  const url = skillSourceUrl(skill.source);
  const scratch = join(dir, '.svc', 'skill-sources', randomUUID());
  await mkdir(join(scratch, '..'), { recursive: true });
  try {
    await gitClone(url, scratch, skill.ref, { cwd: dir, env, confine }, onOutput);
    const found: { name: string; from: string }[] = [];
    if (await isFile(join(scratch, 'SKILL.md'))) {
      found.push({
        name: basename(url)
          .replace(/\.git$/, '')
          .toLowerCase(),
        from: scratch,
      });
    } else {
      for (const parent of [scratch, join(scratch, 'skills')]) {
        for (const entry of await readdir(parent, { withFileTypes: true }).catch(() => [])) {
          if (entry.isDirectory() && (await isFile(join(parent, entry.name, 'SKILL.md')))) {
            found.push({ name: entry.name, from: join(parent, entry.name) });
          }
        }
      }
    }
    if (found.length === 0) throw new Error(`the skill source ${skill.source} holds no SKILL.md`);
    for (const f of found) {
      await cp(f.from, join(skillsDir(dir), f.name), {
        recursive: true,
        filter: (src) => basename(src) !== '.git',
      });
    }
    return found.map((f) => f.name);
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch {
    return false;
  }
}
