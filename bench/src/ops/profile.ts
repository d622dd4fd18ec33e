/**
 * A CPU profile of our service over a window a scenario chooses (the inspector's profiler in
 * the target's process), written as a .cpuprofile that Chrome DevTools opens. Unlike node's
 * --cpu-prof it does not need the process to exit cleanly and holds only the measured part.
 */
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';

let session: Session | undefined;

const post = (s: Session, method: string, params?: object) =>
  new Promise<unknown>((resolve, reject) =>
    s.post(method, params ?? {}, (err, result) => (err ? reject(err) : resolve(result))),
  );

export async function start(): Promise<void> {
  session = new Session();
  session.connect();
  await post(session, 'Profiler.enable');
  await post(session, 'Profiler.setSamplingInterval', { interval: 200 });
  await post(session, 'Profiler.start');
}

/** Stops the profiler and writes the profile under `dir`; returns its path. */
export async function stop(_svc: unknown, args: { dir: string; name: string }): Promise<string> {
  if (!session) throw new Error('no profile was started');
  const { profile } = (await post(session, 'Profiler.stop')) as { profile: unknown };
  session.disconnect();
  session = undefined;
  const file = join(args.dir, `${args.name}-${process.pid}.cpuprofile`);
  writeFileSync(file, JSON.stringify(profile));
  return file;
}
