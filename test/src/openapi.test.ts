import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Validator } from '@seriousme/openapi-schema-validator';
import { ADMIN_ACTIONS, ConversationStreamQuery, errorCatalogue, MultiplexedStreamQuery } from '@svc/core';
import { exports } from '@svc/db';
import { createLogger, loadConfig, startService } from '@svc/gateway';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import t from 'tap';
import { z } from 'zod';
import { signUp, startTestService } from './harness.ts';

interface Operation {
  operationId: string;
  summary?: string;
  description?: string;
  requestBody?: { content?: Record<string, { schema?: unknown; example?: unknown }> };
  responses: Record<
    string,
    {
      description: string;
      content?: Record<string, { schema?: unknown; example?: unknown; examples?: Record<string, { value: unknown }> }>;
    }
  >;
}

t.test('the machine-readable description', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded' });
  const res = await svc.http.get('/api/openapi.json');
  t.equal(res.status, 200, 'is public');
  const doc = res.body;

  t.test('validates as OpenAPI 3.1 with an independent validator', async (t) => {
    t.equal(doc.openapi, '3.1.0');
    const result = await new Validator().validate(doc);
    t.same(result.errors ?? [], [], 'no validation errors');
    t.equal(result.valid, true);
  });

  t.test('has an entry for every route the api role registered', async (t) => {
    const api = await import('@svc/gateway');
    t.ok(api, 'gateway loads');
    const entries = new Set<string>();
    for (const [path, ops] of Object.entries(doc.paths as Record<string, Record<string, unknown>>)) {
      for (const method of Object.keys(ops)) entries.add(`${method.toUpperCase()} ${path}`);
    }
    const registered = svc.routes.filter(
      (r) => r.url.startsWith('/api/') && !r.url.startsWith('/api/docs/') && !r.hidden,
    );
    t.ok(registered.length > 20, `${registered.length} routes registered`);
    for (const r of registered) {
      const templated = r.url.replace(/:([A-Za-z_]+)/g, '{$1}');
      t.ok(entries.has(`${r.method} ${templated}`), `${r.method} ${r.url} is described`);
    }
    t.ok(entries.has('GET /api/docs'), 'the docs viewer is described');
  });

  const operations = () =>
    Object.entries(doc.paths as Record<string, Record<string, Operation>>).flatMap(([path, ops]) =>
      Object.entries(ops).map(([method, op]) => ({ name: `${method.toUpperCase()} ${path}`, op })),
    );

  t.test('every operation has a summary and a description', async (t) => {
    for (const { name, op } of operations()) {
      t.ok(op.summary?.trim(), `${name} has a summary`);
      t.ok(op.description?.trim(), `${name} has a description`);
      t.not(op.description, op.summary, `${name}'s description says more than its summary`);
    }
  });

  t.test('every operation has a unique camelCase operationId', async (t) => {
    const seen = new Map<string, string>();
    for (const { name, op } of operations()) {
      t.match(op.operationId, /^[a-z][A-Za-z0-9]*$/, `${name} has a camelCase operationId`);
      t.notOk(seen.has(op.operationId), `${name}: ${op.operationId} is not also ${seen.get(op.operationId)}`);
      seen.set(op.operationId, name);
    }
    t.equal(doc.paths['/api/agents'].get.operationId, 'listAgents');
    t.equal(doc.paths['/api/agents'].post.operationId, 'createAgent');
    t.equal(doc.paths['/api/conversations/{id}'].get.operationId, 'getConversation');
  });

  t.test('every error answer is the Error schema with the catalogue codes it can carry', async (t) => {
    for (const { name, op } of operations()) {
      const statuses = Object.keys(op.responses).filter((s) => Number(s) >= 400);
      if (name.startsWith('GET /api/') && name !== 'GET /api/docs') t.ok(statuses.includes('429'), `${name} has 429`);
      for (const status of statuses) {
        const json = op.responses[status]?.content?.['application/json'];
        const schema = json?.schema as { $ref?: string; required?: string[] } | undefined;
        t.ok(
          schema?.$ref === '#/components/schemas/Error' ||
            (schema?.required?.includes('error') && schema.required.includes('message')),
          `${name} ${status} is an Error`,
        );
        const codes = Object.keys(json?.examples ?? {});
        t.ok(codes.length > 0, `${name} ${status} lists its codes`);
        for (const code of codes) {
          const entry = errorCatalogue[code as keyof typeof errorCatalogue];
          t.equal(entry?.[0], Number(status), `${name} ${status}: ${code} is a catalogue code of that status`);
          t.same(json?.examples?.[code]?.value, { error: code, message: entry?.[1] }, `${name} ${code} example`);
          t.match(op.responses[status]?.description, `\`${code}\``, `${name} ${status} describes ${code}`);
        }
      }
    }
    const examples = (path: string, method: string, status: string) =>
      Object.keys(doc.paths[path][method].responses[status].content['application/json'].examples);
    t.same(examples('/api/conversations', 'post', '409'), ['no_runner_online', 'sandbox_not_attachable']);
    t.same(examples('/api/conversations/{id}/prompts', 'post', '410'), ['conversation_terminated']);
    t.same(examples('/api/conversations/{id}/prompts', 'post', '503'), ['provisioning', 'runner_offline']);
    t.same(examples('/api/agents/{id}', 'get', '404'), ['not_found']);
    t.same(examples('/api/auth/token', 'post', '403'), ['email_not_verified', 'account_suspended']);
    const register = Object.keys(doc.paths['/api/auth/register'].post.responses);
    t.notOk(register.includes('401') || register.includes('403'), 'a public route asks no credential');
  });

  t.test('each resource is one schema, not a read and a written copy', async (t) => {
    const schemas = doc.components.schemas as Record<string, unknown>;
    const text = JSON.stringify(doc.paths);
    const all = JSON.stringify(doc);
    for (const name of Object.keys(schemas)) {
      t.ok(all.includes(`"#/components/schemas/${name}"`), `${name} is used`);
      const base = name.replace(/Input$/, '');
      if (base !== name && schemas[base]) {
        t.not(
          JSON.stringify(schemas[name]).replace(/Input"/g, '"'),
          JSON.stringify(schemas[base]).replace(/Input"/g, '"'),
          `${name} differs from ${base}`,
        );
      }
    }
    t.notOk(schemas.AgentInput, 'no AgentInput beside Agent');
    t.match(text, /"#\/components\/schemas\/PermissionPolicy"/, 'the policy a request sends is PermissionPolicy');
  });

  t.test('the main bodies have examples, and every example fits its schema', async (t) => {
    const ajv = new Ajv2020.default({ strict: false, allErrors: true, validateFormats: true });
    addFormats.default(ajv);
    ajv.addSchema({ $id: 'openapi.json', components: doc.components });
    const fits = (schema: unknown, example: unknown, what: string) => {
      const validate = ajv.compile(
        JSON.parse(JSON.stringify(schema).replaceAll('"#/components/', '"openapi.json#/components/')),
      );
      t.ok(validate(example), `${what} fits its schema ${validate.errors ? JSON.stringify(validate.errors) : ''}`);
    };
    const schemas = doc.components.schemas as Record<string, { examples?: unknown[] }>;
    for (const name of ['Agent', 'Environment', 'Vault', 'Conversation', 'Turn', 'Runner']) {
      t.ok(schemas[name]?.examples?.length, `${name} has an example`);
    }
    for (const [name, schema] of Object.entries(schemas)) {
      for (const example of schema.examples ?? []) fits({ ...schema, examples: undefined }, example, name);
    }
    const requests: Record<string, unknown> = {};
    for (const { name, op } of operations()) {
      const request = op.requestBody?.content?.['application/json'];
      if (request?.example !== undefined) {
        requests[op.operationId] = request.example;
        fits(request.schema, request.example, `${name} request`);
      }
      for (const [status, response] of Object.entries(op.responses)) {
        const media = response.content?.['application/json'];
        if (media?.example !== undefined) fits(media.schema, media.example, `${name} ${status}`);
        for (const [code, e] of Object.entries(media?.examples ?? {})) fits(media?.schema, e.value, `${name} ${code}`);
      }
    }
    t.same(Object.keys(requests).sort(), [
      'createAgent',
      'createConversation',
      'createEnvironment',
      'createRunner',
      'createVault',
      'putAgent',
      'putEnvironment',
      'renameVault',
      'sendPrompt',
      'updateAgent',
      'updateEnvironment',
    ]);

    // The service itself takes the request examples.
    const { key } = await signUp(svc);
    const env = await svc.http.post('/api/environments', { token: key, body: requests.createEnvironment });
    t.equal(env.status, 201, 'the environment example is accepted');
    const agentExample = { ...(requests.createAgent as object), environment_id: env.body.id };
    const agent = await svc.http.post('/api/agents', { token: key, body: agentExample });
    t.equal(agent.status, 201, 'the agent example is accepted');
    t.match(agent.body, agentExample, 'and stored as given (in its own environment)');
    const vault = await svc.http.post('/api/vaults', { token: key, body: requests.createVault });
    t.equal(vault.status, 201, 'the vault example is accepted');
  });

  t.test("the streams' query is described from the schemas the streams read it with", async (t) => {
    const described = (path: string) =>
      (doc.paths[path].get.parameters as { name: string; in: string; description?: string }[])
        .filter((p) => p.in === 'query')
        .map((p) => [p.name, p.description]);
    const fromSchema = (schema: z.ZodObject) =>
      Object.entries(
        (z.toJSONSchema(schema, { io: 'input' }) as { properties: Record<string, { description?: string }> })
          .properties,
      ).map(([name, s]) => [name, s.description]);
    t.same(described('/api/conversations/{id}/stream'), fromSchema(ConversationStreamQuery));
    t.same(described('/api/events/stream'), fromSchema(MultiplexedStreamQuery));
    t.same(described('/api/team/stream'), fromSchema(MultiplexedStreamQuery));
  });

  t.test('the privilege trail and the export file are described from the lists the code writes', async (t) => {
    const trail = doc.paths['/api/admin/events'].get as Operation;
    for (const [action, keys] of Object.entries(ADMIN_ACTIONS)) {
      t.ok(trail.description?.includes(`\`${action}\``), `GET /api/admin/events names ${action}`);
      for (const key of keys) t.ok(trail.description?.includes(`\`${key}\``), `and its metadata key ${key}`);
    }
    const event = doc.components.schemas.AdminEvent as { properties: { action: { type: string; enum?: string[] } } };
    t.same(
      event.properties.action,
      { type: 'string', description: 'What was done (the actions are listed on GET /api/admin/events).' },
      'the action is an open string that points to the list (a newer node may record one this list lacks)',
    );
    const lists = [...Object.keys(exports.EXPORT_SECTIONS), 'events'];
    t.ok(lists.includes('credit_ledger') && lists.includes('support_reports'));
    const request = doc.paths['/api/account/exports'].post as Operation;
    const download = doc.paths['/api/account/exports/{id}/download'].get as Operation;
    t.match(download.description, `exported_at, ${lists.join(', ')}}`, 'the download names every list, in file order');
    for (const section of Object.keys(exports.EXPORT_SECTIONS)) {
      t.match(request.description, new RegExp(`[(, ]${section}[,)]`), `the request names ${section}`);
    }
  });

  t.test('documented resources have concrete schemas', async (t) => {
    for (const [name, schema] of Object.entries(doc.components.schemas as Record<string, Record<string, unknown>>)) {
      t.ok(schema.type || schema.anyOf || schema.oneOf || schema.allOf, `${name} has a type`);
    }
    const me = doc.paths['/api/auth/me'].get.responses['200'].content['application/json'].schema;
    t.ok(me.$ref || me.properties, 'GET /api/auth/me describes its body');
  });

  t.test('each route states its own security: the public ones need no credential', async (t) => {
    const security = (method: string, path: string) =>
      (doc.paths[path]?.[method] as { security?: unknown[] } | undefined)?.security;
    const publicOnes = [
      ['post', '/api/auth/register'],
      ['post', '/api/auth/verify'],
      ['post', '/api/auth/token'],
      ['post', '/api/auth/forgot'],
      ['post', '/api/auth/reset'],
      ['post', '/api/auth/resend-verification'],
      ['post', '/api/auth/email/confirm'],
      ['post', '/api/auth/login'],
      ['post', '/api/oauth/token'],
      ['post', '/api/oauth/revoke'],
      ['get', '/api/health'],
    ];
    for (const [method, path] of publicOnes) {
      t.ok(doc.paths[path as string]?.[method as string], `${method} ${path} is described`);
      t.same(security(method as string, path as string), [], `${method} ${path} needs no credential`);
    }
    t.same(doc.security, [{ bearer: [] }, { session: [] }], 'the default: a key or a session');
    for (const [method, path] of [
      ['get', '/api/auth/me'],
      ['post', '/api/conversations'],
    ]) {
      t.equal(security(method as string, path as string), undefined, `${method} ${path} takes the default`);
    }
  });

  t.test('the docs viewer and discovery texts are served without internet', async (t) => {
    const page = await fetch(`${svc.url}/api/docs`, { redirect: 'follow' });
    t.equal(page.status, 200);
    const html = await page.text();
    t.match(html, /swagger/i);
    t.notMatch(html, /https?:\/\/(?!127\.0\.0\.1)[a-z0-9.-]+\/[^"']*\.js/i, 'no script from another host');
    const llms = await (await fetch(`${svc.url}/llms.txt`)).text();
    t.match(llms, /GET \/api\/auth\/me/);
    const full = await (await fetch(`${svc.url}/llms-full.txt`)).text();
    t.match(full, /## POST \/api\/auth\/register/);
    t.match(full, /password \(string, required\)/);
    const skill = await fetch(`${svc.url}/skill`);
    t.equal(skill.status, 200);
    t.match(await skill.text(), /^---\nname: /);
  });
});

t.test('the description names PUBLIC_URL as its server', async (t) => {
  // Started without the harness: its client talks to PUBLIC_URL, which here is not this machine.
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-test-openapi-'));
  const config = loadConfig({
    PORT: '0',
    HOST: '127.0.0.1',
    DATA_DIR: dataDir,
    MAIL_DIR: join(dataDir, 'mail'),
    DATABASE_URL: 'memory',
    MASTER_KEY: randomBytes(32).toString('hex'),
    LOG_LEVEL: 'silent',
    PUBLIC_URL: 'https://agents.example.test/',
  });
  const service = await startService(config, createLogger(config.LOG_LEVEL));
  t.teardown(async () => {
    await service.close();
    await rm(dataDir, { recursive: true, force: true });
  });
  const doc = (await (await fetch(`http://127.0.0.1:${service.port}/api/openapi.json`)).json()) as { servers: unknown };
  t.same(doc.servers, [{ url: 'https://agents.example.test', description: 'This instance (PUBLIC_URL)' }]);
});
