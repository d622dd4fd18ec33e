import t from 'tap';
import { backends, retireSpy, signUp, startTestService } from './harness.ts';

for (const backend of backends()) {
  t.test(`bulk apply on ${backend}`, async (t) => {
    const spy = retireSpy();
    const retired = spy.calls;
    const svc = await startTestService(t, {
      backend,
      overrides: {
        retireSandboxes: async (target) => {
          retired.push(target);
          return 0;
        },
      },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;

    // Agents first in the manifest: apply still does environments, then vaults, then agents.
    const manifest = {
      resources: [
        {
          kind: 'Agent',
          name: 'builder',
          spec: { runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment: 'ci', system: 'Build things.' },
        },
        {
          kind: 'Environment',
          name: 'ci',
          spec: {
            setup_script: 'npm ci',
            packages: { apt: ['git'] },
            secrets: { NPM_TOKEN: 'npm-secret-value-1', GH_TOKEN: 'gh-secret-value-2' },
          },
        },
        {
          kind: 'Vault',
          name: 'deploy',
          spec: {
            secrets: {
              AWS_KEY: 'aws-secret-value-3',
              TEMP: { value: 'temp-secret-4', expires_at: '2999-01-01T00:00:00Z' },
            },
          },
        },
      ],
    };

    t.test('creates everything in dependency order and reports per resource and per secret', async (t) => {
      const res = await http.post('/api/apply', { token, body: manifest });
      t.equal(res.status, 200);
      t.same(
        res.body.data.map((r: { kind: string; name: string; action: string }) => [r.kind, r.name, r.action]),
        [
          ['Agent', 'builder', 'created'],
          ['Environment', 'ci', 'created'],
          ['Vault', 'deploy', 'created'],
        ],
        'results in manifest order',
      );
      t.same(res.body.data[1].secrets, { GH_TOKEN: { outcome: 'created' }, NPM_TOKEN: { outcome: 'created' } });
      t.same(res.body.data[2].secrets, { AWS_KEY: { outcome: 'created' }, TEMP: { outcome: 'created' } });
      t.notMatch(res.text, /secret-value/, 'no secret value is echoed');
      const agent = await http.get(`/api/agents/${res.body.data[0].id}`, { token });
      t.equal(
        agent.body.environment_id,
        res.body.data[1].id,
        "the agent's environment resolved by name within the manifest",
      );
      t.equal(agent.body.system, 'Build things.');
      const env = await http.get(`/api/environments/${res.body.data[1].id}`, { token });
      t.match(env.body, { setup_script: 'npm ci', secret_count: 2, agent_count: 1 });
      const vaultSecrets = await http.get(`/api/vaults/${res.body.data[2].id}/secrets`, { token });
      t.equal(
        vaultSecrets.body.data.find((s: { key: string }) => s.key === 'TEMP').expires_at,
        '2999-01-01T00:00:00.000Z',
      );
    });

    t.test('applying the same manifest again is updated with no change', async (t) => {
      const before = await http.get('/api/environments', { token });
      const res = await http.post('/api/apply', { token, body: manifest });
      t.same(
        res.body.data.map((r: { action: string }) => r.action),
        ['updated', 'updated', 'updated'],
      );
      t.same(res.body.data[1].secrets, { GH_TOKEN: { outcome: 'unchanged' }, NPM_TOKEN: { outcome: 'unchanged' } });
      t.same(res.body.data[2].secrets, { AWS_KEY: { outcome: 'unchanged' }, TEMP: { outcome: 'unchanged' } });
      const after = await http.get('/api/environments', { token });
      t.same(after.body.data[0].env_vars, before.body.data[0].env_vars);
      t.same(after.body.data[0].setup_script, before.body.data[0].setup_script);
      t.equal(retired.length, 0, 'nothing retired when nothing changed');
    });

    t.test('a mix of good and bad resources: each good one applies, each bad one says why', async (t) => {
      const res = await http.post('/api/apply', {
        token,
        body: {
          resources: [
            {
              kind: 'Environment',
              name: 'ci',
              spec: { setup_script: 'npm ci && npm test', secrets: { NPM_TOKEN: 'rotated-value-5', 'BAD KEY': 'x' } },
            },
            { kind: 'Environment', name: 'broken', spec: { packages: { apt: ['NOT VALID'] }, colour: 'red' } },
            {
              kind: 'Agent',
              name: 'wrong-model',
              spec: { runtime: 'codex', model: 'anthropic/claude', environment: 'ci' },
            },
            {
              kind: 'Agent',
              name: 'orphan',
              spec: { runtime: 'claude', model: 'anthropic/x', environment: 'nowhere' },
            },
            {
              kind: 'Agent',
              name: 'fine',
              spec: { runtime: 'gemini', model: 'google/gemini-2.5-pro', environment: 'ci' },
            },
            { kind: 'Vault', name: 'deploy', spec: { secrets: { AWS_KEY: '' } } },
            { kind: 'Vault', name: 'extra', spec: { color: 'blue' } },
            {
              kind: 'Agent',
              name: 'fine',
              spec: { runtime: 'gemini', model: 'google/gemini-2.5-pro', environment: 'ci' },
            },
          ],
        },
      });
      t.equal(res.status, 200, 'always 200');
      const [ci, broken, wrongModel, orphan, fine, deploy, extra, dup] = res.body.data;
      t.equal(ci.action, 'updated');
      t.same(ci.secrets.NPM_TOKEN, { outcome: 'updated' });
      t.equal(ci.secrets['BAD KEY'].outcome, 'error');
      t.equal(broken.action, 'error');
      t.ok(broken.errors['packages.apt.0'], 'changeset-style field errors');
      t.ok(
        Object.values(broken.errors)
          .flat()
          .some((m) => /colour/.test(String(m))),
        'unknown fields are named',
      );
      t.equal(wrongModel.action, 'error');
      t.match(wrongModel.errors.model.join(), /provider must be openai/);
      t.equal(orphan.action, 'error');
      t.match(orphan.errors.environment.join(), /no environment named nowhere/);
      t.equal(fine.action, 'created');
      t.equal(deploy.action, 'updated');
      t.equal(deploy.secrets.AWS_KEY.outcome, 'error', 'an empty value is refused, per key');
      t.equal(extra.action, 'error');
      t.equal(dup.action, 'error');
      t.match(dup.errors.name.join(), /twice/);
      t.equal(
        (await http.get('/api/environments', { token })).body.data.length,
        1,
        'the broken environment was not created',
      );
      t.notMatch(res.text, /rotated-value/);
      const names = (await http.get('/api/agents', { token })).body.data.map((a: { name: string }) => a.name).sort();
      t.same(names, ['builder', 'fine']);
    });

    t.test('an agent can name an environment that already exists; moving it calls the retire seam', async (t) => {
      await http.post('/api/environments', { token, body: { name: 'staging' } });
      const res = await http.post('/api/apply', {
        token,
        body: {
          resources: [
            {
              kind: 'Agent',
              name: 'builder',
              spec: { runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment: 'staging' },
            },
          ],
        },
      });
      t.equal(res.body.data[0].action, 'updated');
      t.equal(retired.length, 1);
      t.equal(retired[0]?.reason, 'agent_environment_changed');
      const agent = await http.get(`/api/agents/${res.body.data[0].id}`, { token });
      t.equal(agent.body.system, '', 'apply replaces the agent with its spec: an omitted field returns to its default');
    });

    t.test('names resolve only within the caller account', async (t) => {
      const other = await signUp(svc);
      const res = await http.post('/api/apply', {
        token: other.key,
        body: {
          resources: [
            { kind: 'Agent', name: 'spy', spec: { runtime: 'claude', model: 'anthropic/x', environment: 'ci' } },
          ],
        },
      });
      t.equal(res.body.data[0].action, 'error', "another account's environment name does not resolve");
      const theirs = await http.post('/api/apply', {
        token: other.key,
        body: { resources: [{ kind: 'Vault', name: 'deploy', spec: { secrets: { AWS_KEY: 'their-own-value' } } }] },
      });
      t.equal(theirs.body.data[0].action, 'created', 'the same name in another account is a different vault');
    });

    t.test('malformed manifests are rejected as a whole', async (t) => {
      t.equal(
        (await http.post('/api/apply', { token, body: { resources: [{ kind: 'Secret', name: 'x', spec: {} }] } }))
          .status,
        422,
      );
      t.equal((await http.post('/api/apply', { token, body: { resource: [] } })).status, 422);
      t.equal((await http.post('/api/apply', { token, body: [] })).status, 400);
    });
  });
}
