import { Validator } from '@seriousme/openapi-schema-validator';
import { ConversationStreamQuery, MultiplexedStreamQuery } from '@svc/core';
import t from 'tap';
import { z } from 'zod';
import { startTestService } from './harness.ts';

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

  t.test('documented resources have concrete schemas', async (t) => {
    for (const [name, schema] of Object.entries(doc.components.schemas as Record<string, Record<string, unknown>>)) {
      t.ok(schema.type || schema.anyOf || schema.oneOf || schema.allOf, `${name} has a type`);
    }
    const me = doc.paths['/api/auth/me'].get.responses['200'].content['application/json'].schema;
    t.ok(me.$ref || me.properties, 'GET /api/auth/me describes its body');
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
