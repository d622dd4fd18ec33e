/**
 * The test harness: starts the real service in-process on a fresh database (a new database on
 * the run's throwaway Postgres, or a throwaway embedded PostgreSQL), talks to it over real HTTP through the
 * edge, and validates every response against the route's OpenAPI schema, so the description
 * cannot drift from the wire.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Config, createLogger, loadConfig, type Service, type ServiceOverrides, startService } from '@svc/gateway';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import type { Logger } from 'pino';
import postgres from 'postgres';
import type { Test } from 'tap';
import type { RetireTarget } from '../../gateway/src/services/sandboxes.ts';

export type Backend = 'postgres+redis' | 'embedded';

/** The backends a test should run against: the run's real servers when present, and embedded. */
export function backends(): Backend[] {
  const list: Backend[] = [];
  if (process.env.TEST_DATABASE_URL) list.push('postgres+redis');
  list.push('embedded');
  return list;
}

/**
 * One contract for both transports of the runner fabric: the edge's (uWebSockets.js) on every
 * backend, and the api role's alone (EDGE=false, @fastify/websocket) on the embedded one.
 */
export function transportSetups(): { backend: Backend; edge: boolean }[] {
  return backends().flatMap((backend): { backend: Backend; edge: boolean }[] =>
    backend === 'embedded'
      ? [
          { backend, edge: true },
          { backend, edge: false },
        ]
      : [{ backend, edge: true }],
  );
}

/** The preferred backend for tests that need only one: the real servers when the run has them. */
export function primaryBackend(): Backend {
  return backends()[0] as Backend;
}

/** A fresh database on the run's Postgres, dropped when `t` ends; its URL. */
export async function createDatabase(t: Test): Promise<string> {
  const admin = process.env.TEST_DATABASE_URL;
  if (!admin) throw new Error('TEST_DATABASE_URL is not set; run the suite through `npm test`');
  const name = `svc_test_${randomBytes(6).toString('hex')}`;
  const sql = postgres(admin, { max: 1, onnotice: () => {} });
  await sql.unsafe(`CREATE DATABASE ${name}`);
  await sql.end();
  t.teardown(async () => {
    const s = postgres(admin, { max: 1, onnotice: () => {} });
    await s.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await s.end();
  });
  const url = new URL(admin);
  url.pathname = `/${name}`;
  return url.toString();
}

export interface TestService extends Service {
  dataDir: string;
  mailDir: string;
  backend: Backend;
  http: Client;
}

/** Starts the whole service for one test, torn down with it. `env` overrides configuration. */
export async function startTestService(
  t: Test,
  options: { backend?: Backend; env?: Record<string, string>; overrides?: ServiceOverrides; log?: Logger } = {},
): Promise<TestService> {
  const backend = options.backend ?? primaryBackend();
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-test-data-'));
  const mailDir = join(dataDir, 'mail');
  const env: Record<string, string> = {
    PORT: '0',
    HOST: '127.0.0.1',
    DATA_DIR: dataDir,
    MAIL_DIR: mailDir,
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent',
    RATE_LIMIT_PER_MINUTE: '0',
    // The webhook consumer stays off unless a test turns it on: tests that write delivery jobs
    // themselves then count only their own.
    WEBHOOK_CONSUMER_SWEEP_MS: '0',
    MASTER_KEY: randomBytes(32).toString('hex'),
    SHUTDOWN_GRACE_MS: '2000',
    ...(backend === 'postgres+redis'
      ? {
          DATABASE_URL: await createDatabase(t),
          REDIS_URL: process.env.TEST_REDIS_URL ?? '',
          REDIS_KEY_PREFIX: `t${randomBytes(4).toString('hex')}:`,
        }
      : { DATABASE_URL: 'memory' }),
    ...options.env,
  };
  const config: Config = loadConfig(env);
  const service = await startService(config, options.log ?? createLogger(config.LOG_LEVEL), options.overrides);
  t.teardown(async () => {
    await service.close();
    await rm(dataDir, { recursive: true, force: true });
  });
  const http = new Client(service.url, await openApiValidator(service.url));
  return Object.assign(service, { dataDir, mailDir, backend, http });
}

/** Two nodes on one Postgres and one Redis, both configured with `env`. */
export async function twoNodes(t: Test, env: Record<string, string>) {
  const a = await startTestService(t, { backend: 'postgres+redis', env });
  const b = await startTestService(t, {
    backend: 'postgres+redis',
    env: {
      ...env,
      DATABASE_URL: a.config.DATABASE_URL as string,
      REDIS_KEY_PREFIX: a.config.REDIS_KEY_PREFIX,
      MASTER_KEY: a.config.MASTER_KEY as string,
    },
  });
  return { a, b };
}

// ---------------------------------------------------------------------------------------------
// Response validation against the OpenAPI description.

type Validate = ((data: unknown) => boolean) & { errors?: unknown };
interface ResponseCheck {
  check(method: string, path: string, status: number, contentType: string | null, body: unknown): string | undefined;
}

const docCache = new Map<string, Promise<ResponseCheck>>();

async function openApiValidator(baseUrl: string): Promise<ResponseCheck> {
  const res = await fetch(`${baseUrl}/api/openapi.json`);
  const doc = (await res.json()) as {
    paths: Record<
      string,
      Record<string, { responses?: Record<string, { content?: Record<string, { schema?: object }> }> }>
    >;
    components?: Record<string, unknown>;
  };
  const key = JSON.stringify(Object.keys(doc.paths));
  const cached = docCache.get(key);
  if (cached) return cached;
  const built = (async () => {
    const ajv = new Ajv2020.default({ strict: false, allErrors: true, validateFormats: true });
    addFormats.default(ajv);
    ajv.addSchema({ $id: 'openapi.json', components: doc.components ?? {} });
    const routes = Object.entries(doc.paths).map(([template, ops]) => ({
      template,
      pattern: new RegExp(`^${template.replace(/\{[^}]+\}/g, '[^/]+')}$`),
      ops,
    }));
    const compiled = new Map<object, Validate>();
    return {
      check(method: string, path: string, status: number, contentType: string | null, body: unknown) {
        const route = routes.find((r) => r.pattern.test(path));
        if (!route) return undefined; // not an API route (discovery texts, viewer assets)
        const op = route.ops[method.toLowerCase()];
        if (!op)
          return status === 405 || status === 404 ? undefined : `no OpenAPI operation ${method} ${route.template}`;
        const response = op.responses?.[String(status)];
        if (!response) {
          // 429 comes from the edge on any route; 500/503 are never documented per route.
          if (status === 429 || status >= 500) return undefined;
          return `status ${status} is not documented for ${method} ${route.template}`;
        }
        const schema = response.content?.['application/json']?.schema;
        if (!schema) return undefined;
        if (!contentType?.includes('application/json'))
          return `expected JSON for ${method} ${route.template} ${status}`;
        let validate = compiled.get(schema);
        if (!validate) {
          const rewritten = JSON.parse(
            JSON.stringify(schema).replaceAll('"#/components/', '"openapi.json#/components/'),
          );
          validate = ajv.compile(rewritten) as Validate;
          compiled.set(schema, validate);
        }
        if (!validate(body)) {
          return `response of ${method} ${route.template} ${status} does not match its schema: ${JSON.stringify(validate.errors)}`;
        }
        return undefined;
      },
    };
  })();
  docCache.set(key, built);
  return built;
}

// ---------------------------------------------------------------------------------------------
// HTTP client.

export interface Reply<T = any> {
  status: number;
  headers: Headers;
  body: T;
  text: string;
}

export interface CallOptions {
  body?: unknown;
  rawBody?: string | Uint8Array;
  token?: string;
  cookie?: string;
  headers?: Record<string, string>;
}

/**
 * fetch, tried again when the connection was reset before it was established. Nothing reached
 * the server then, so the retry cannot repeat a request. (On a loaded machine, a long suite's
 * churn of loopback connections very rarely has a SYN answered with a reset: one in some
 * 19,000 requests of a CI run.)
 */
async function fetchRetryingConnect(url: string, init: RequestInit): Promise<Response> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fetch(url, init);
    } catch (err) {
      const cause = (err as { cause?: { code?: string; syscall?: string } }).cause;
      if (attempt >= 3 || cause?.syscall !== 'connect' || cause.code !== 'ECONNRESET') throw err;
    }
  }
}

export class Client {
  constructor(
    readonly baseUrl: string,
    private readonly validator: ResponseCheck,
  ) {}

  /** Any request; the answer is checked against the OpenAPI description before it is returned. */
  async call<T = any>(method: string, path: string, options: CallOptions = {}): Promise<Reply<T>> {
    const headers: Record<string, string> = { ...options.headers };
    let body: string | Uint8Array | undefined;
    if (options.rawBody !== undefined) body = options.rawBody;
    else if (options.body !== undefined) {
      body = JSON.stringify(options.body);
      headers['content-type'] ??= 'application/json';
    }
    if (options.token) headers.authorization = `Bearer ${options.token}`;
    if (options.cookie) headers.cookie = options.cookie;
    const res = await fetchRetryingConnect(`${this.baseUrl}${path}`, { method, headers, body, redirect: 'manual' });
    const text = await res.text();
    const contentType = res.headers.get('content-type');
    let parsed: unknown = text;
    if (contentType?.includes('application/json') && text.length) parsed = JSON.parse(text);
    const problem = this.validator.check(method, path.split('?')[0] as string, res.status, contentType, parsed);
    if (problem) throw new Error(`OpenAPI drift: ${problem}`);
    return { status: res.status, headers: res.headers, body: parsed as T, text };
  }

  get<T = any>(path: string, options?: CallOptions) {
    return this.call<T>('GET', path, options);
  }
  post<T = any>(path: string, options?: CallOptions) {
    return this.call<T>('POST', path, options);
  }
  put<T = any>(path: string, options?: CallOptions) {
    return this.call<T>('PUT', path, options);
  }
  delete<T = any>(path: string, options?: CallOptions) {
    return this.call<T>('DELETE', path, options);
  }
}

// ---------------------------------------------------------------------------------------------
// Mail and accounts.

export interface Mail {
  to: string;
  subject: string;
  text: string;
  html: string;
}

/** Waits for mail to `to` whose subject matches, newer than `after` files already seen. */
export async function waitForMail(mailDir: string, to: string, subject: RegExp, timeoutMs = 10_000): Promise<Mail> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const files = await readdir(mailDir).catch(() => [] as string[]);
    for (const f of files
      .filter((x) => x.endsWith('.json'))
      .sort()
      .reverse()) {
      const mail = JSON.parse(await readFile(join(mailDir, f), 'utf8')) as Mail;
      if (mail.to === to && subject.test(mail.subject)) return mail;
    }
    if (Date.now() > deadline) throw new Error(`no mail to ${to} matching ${subject} within ${timeoutMs}ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function allMail(mailDir: string): Promise<Mail[]> {
  const files = await readdir(mailDir).catch(() => [] as string[]);
  return Promise.all(
    files
      .filter((x) => x.endsWith('.json'))
      .sort()
      .map(async (f) => JSON.parse(await readFile(join(mailDir, f), 'utf8')) as Mail),
  );
}

export function tokenFrom(mail: Mail): string {
  const m = /token=([A-Za-z0-9_-]+)/.exec(mail.text);
  if (!m?.[1]) throw new Error(`no token in mail "${mail.subject}"`);
  return m[1];
}

let counter = 0;
export function uniqueEmail(label = 'user'): string {
  counter++;
  return `${label}-${counter}-${randomBytes(3).toString('hex')}@example.com`;
}

export const PASSWORD = 'correct horse battery staple';

/** Registers, verifies by the mailed link, and exchanges the password for a full-scope key. */
export async function signUp(
  svc: TestService,
  email = uniqueEmail(),
): Promise<{ email: string; key: string; accountId: string }> {
  const reg = await svc.http.post('/api/auth/register', { body: { email, password: PASSWORD } });
  if (reg.status !== 201) throw new Error(`register answered ${reg.status}: ${reg.text}`);
  const mail = await waitForMail(svc.mailDir, email, /verify/i);
  const verified = await svc.http.post('/api/auth/verify', { body: { token: tokenFrom(mail) } });
  if (verified.status !== 200) throw new Error(`verify answered ${verified.status}: ${verified.text}`);
  const tok = await svc.http.post('/api/auth/token', { body: { email, password: PASSWORD } });
  if (tok.status !== 201) throw new Error(`token answered ${tok.status}: ${tok.text}`);
  const me = await svc.http.get('/api/auth/me', { token: tok.body.key });
  return { email, key: tok.body.key as string, accountId: me.body.id as string };
}

/** A stand-in for the retire-sandboxes seam that records every call (pass as `overrides`). */
export function retireSpy(): { calls: RetireTarget[]; retireSandboxes: (target: RetireTarget) => Promise<number> } {
  const calls: RetireTarget[] = [];
  return {
    calls,
    retireSandboxes: async (target) => {
      calls.push(target);
      return 0;
    },
  };
}
