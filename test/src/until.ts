const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `check` every `stepMs` until it holds, for `ms` counted in steps (a busy machine waits
 * longer rather than giving up early). Resolves to its last answer: the caller asserts on it.
 */
export async function eventually(check: () => boolean | Promise<boolean>, ms: number, stepMs = 25): Promise<boolean> {
  for (let waited = 0; waited < ms; waited += stepMs) {
    if (await check()) return true;
    await sleep(stepMs);
  }
  return check();
}

/**
 * Polls `check` every 50 ms until it gives a value (anything but undefined, null or false) and
 * resolves to that value; rejects naming `what` once `timeoutMs` of wall time has passed.
 */
export async function until<T>(
  what: string,
  check: () => T | undefined | null | false | Promise<T | undefined | null | false>,
  timeoutMs = 15_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== null && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/**
 * Whether `promise` resolves within `ms`: true as soon as it does, false once `ms` have passed
 * (its rejection rejects). The timer goes with the answer: a sleep that lost a race kept the
 * file's process alive until it fired, as long as 40 s after the file's last test.
 */
export async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const lapsed = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true as const), lapsed]);
  } finally {
    clearTimeout(timer);
  }
}
