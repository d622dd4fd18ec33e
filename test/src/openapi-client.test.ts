/**
 * The OpenAPI document is good enough for a client generator: openapi-typescript turns the
 * running service's /api/openapi.json into types, a small openapi-fetch program is
 * type-checked against them with the TypeScript compiler (so a document that generates loose
 * or broken types fails here), and that same program then calls the service.
 */
import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import openapiTS, { astToString } from 'openapi-typescript';
import t from 'tap';
import { tsImport } from 'tsx/esm/api';
import ts from 'typescript';
import { signUp, startTestService } from './harness.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/**
 * The client program, written as a user of the generated types would write it. The
 * `@ts-expect-error` lines prove the types are precise: were a body typed loosely (`any`,
 * `{}`), the compiler would report the directive as unused.
 */
const CLIENT_PROGRAM = `
import createClient from 'openapi-fetch';
import type { components, paths } from './schema.ts';

type Agent = components['schemas']['Agent'];

export async function run(baseUrl: string, key: string) {
  const client = createClient<paths>({ baseUrl, headers: { authorization: \`Bearer \${key}\` } });

  const environment = await client.POST('/api/environments', { body: { name: 'generated-client' } });
  if (!environment.data) throw new Error(\`createEnvironment: \${environment.error?.error}\`);

  const created = await client.POST('/api/agents', {
    body: {
      name: 'from-a-generated-client',
      runtime: 'claude',
      model: 'anthropic/claude-sonnet-4-5',
      environment_id: environment.data.id,
      permission_policy: { default: 'ask', ask: ['execute'] },
    },
  });
  const agent: Agent | undefined = created.data;

  const listed = await client.GET('/api/agents', { params: { query: { runtime: 'claude' } } });
  const names: string[] | undefined = listed.data?.data.map((a) => a.name);

  const missing = await client.GET('/api/conversations/{id}', { params: { path: { id: 'conv_none' } } });
  const code: string | undefined = missing.error?.error;

  return { agent, names, code, status: missing.response.status, message: missing.error?.message };
}

export function neverCalled(client: ReturnType<typeof createClient<paths>>) {
  // @ts-expect-error runtime is one of the catalogue's runtimes
  void client.POST('/api/agents', { body: { name: 'x', runtime: 'cobol', model: 'a/b', environment_id: 'e' } });
  // @ts-expect-error an agent needs an environment_id
  void client.POST('/api/agents', { body: { name: 'x', runtime: 'claude', model: 'a/b' } });
  // @ts-expect-error no such route
  void client.GET('/api/agent');
}
`;

function typeErrors(files: string[]): string[] {
  const program = ts.createProgram(files, {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    allowImportingTsExtensions: true,
    skipLibCheck: true,
    types: [],
    lib: ['lib.es2023.d.ts', 'lib.dom.d.ts'],
  });
  return ts
    .getPreEmitDiagnostics(program)
    .map((d) => `${d.file?.fileName ?? ''}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`);
}

t.test('a client generated from the document type-checks and calls the service', async (t) => {
  const svc = await startTestService(t);
  const { key } = await signUp(svc);

  const dir = await mkdtemp(join(tmpdir(), 'svc-openapi-client-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  // The program resolves openapi-fetch from this repository's dependencies.
  await symlink(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir');
  await writeFile(join(dir, 'package.json'), JSON.stringify({ type: 'module' }));

  const schema = astToString(await openapiTS(new URL(`${svc.url}/api/openapi.json`)));
  await writeFile(join(dir, 'schema.ts'), schema);
  await writeFile(join(dir, 'client.ts'), CLIENT_PROGRAM);
  t.match(schema, /listAgents: \{/, 'operations are named by operationId');

  t.same(typeErrors([join(dir, 'client.ts')]), [], 'the client program type-checks against the generated types');

  // Through tsx's loader for this import alone: the test itself may run compiled (test/run.mjs).
  const client = (await tsImport(pathToFileURL(join(dir, 'client.ts')).href, import.meta.url)) as {
    run(baseUrl: string, key: string): Promise<Record<string, unknown>>;
  };
  const result = await client.run(svc.url, key);
  t.match(result.agent, {
    id: String,
    name: 'from-a-generated-client',
    runtime: 'claude',
    model: 'anthropic/claude-sonnet-4-5',
    permission_policy: { default: 'ask', ask: ['execute'] },
    conversation_count: 0,
  });
  t.same(result.names, ['from-a-generated-client'], 'listAgents returns the agent');
  t.same(
    { status: result.status, code: result.code, message: result.message },
    { status: 404, code: 'not_found', message: 'Conversation not found.' },
    'an unknown conversation answers the typed Error body',
  );
});

t.test('a document whose types do not fit the program fails the type check', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'svc-openapi-client-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await symlink(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir');
  await writeFile(join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
  // A document that describes the routes without bodies: every type is loose.
  const loose = {
    openapi: '3.1.0',
    info: { title: 'loose', version: '0' },
    paths: Object.fromEntries(
      ['/api/environments', '/api/agents', '/api/conversations/{id}'].map((p) => [
        p,
        { get: { responses: { 200: { description: 'ok' } } }, post: { responses: { 200: { description: 'ok' } } } },
      ]),
    ),
    components: { schemas: { Agent: {} } },
  };
  await writeFile(join(dir, 'schema.ts'), astToString(await openapiTS(loose as never)));
  await writeFile(join(dir, 'client.ts'), CLIENT_PROGRAM);
  t.not(typeErrors([join(dir, 'client.ts')]).length, 0, 'the compiler refuses it');
});
