import t from 'tap';
import { backends, signUp, startTestService } from './harness.ts';

for (const backend of backends()) {
  t.test(`environments and vaults on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;

    t.test('an environment is created with every field and read back with its counts', async (t) => {
      const body = {
        name: 'web',
        packages: { apt: ['ripgrep', 'python3=3.11.2-1'], npm: ['typescript', '@biomejs/biome@2.5.15'], pip: ['x'] },
        env_vars: { NODE_ENV: 'test', LOG_LEVEL: 'debug' },
        repositories: [
          { url: 'https://github.com/acme/web.git', mount_path: 'web' },
          { url: 'git@github.com:acme/api.git', mount_path: 'services/api' },
        ],
        setup_script: 'npm ci',
        networking_config: { allowed_hosts: ['registry.npmjs.org', '*.github.com'] },
      };
      const res = await http.post('/api/environments', { token, body });
      t.equal(res.status, 201);
      t.match(res.body, { ...body, networking_type: 'limited', secret_count: 0, agent_count: 0 });
      t.same(res.body.packages.pip, ['x'], 'other package keys are stored');
      const got = await http.get(`/api/environments/${res.body.id}`, { token });
      t.same(got.body, res.body);
      const list = await http.get('/api/environments', { token });
      t.same(
        list.body.data.map((e: { id: string }) => e.id),
        [res.body.id],
      );
    });

    t.test('validation: each bad field is a 422 naming it, and nothing is created', async (t) => {
      const cases: [string, Record<string, unknown>, string][] = [
        ['apt name', { packages: { apt: ['Bad Name!'] } }, 'packages.apt.0'],
        ['apt not a list', { packages: { apt: 'git' } }, 'packages.apt'],
        ['npm name', { packages: { npm: ['UPPER'] } }, 'packages.npm.0'],
        ['env var name', { env_vars: { '1BAD': 'x' } }, 'env_vars.1BAD'],
        ['repo url', { repositories: [{ url: 'ftp://x/y', mount_path: 'a' }] }, 'repositories.0.url'],
        ['absolute mount', { repositories: [{ url: 'https://h/r', mount_path: '/etc' }] }, 'repositories.0.mount_path'],
        [
          'dotdot mount',
          { repositories: [{ url: 'https://h/r', mount_path: 'a/../../b' }] },
          'repositories.0.mount_path',
        ],
        ['host', { networking_config: { allowed_hosts: ['not a host'] } }, 'networking_config.allowed_hosts.0'],
        ['unknown field', { colour: 'red' }, '(body)'],
        ['networking type', { networking_type: 'wide-open' }, 'networking_type'],
      ];
      for (const [label, extra, path] of cases) {
        const res = await http.post('/api/environments', { token, body: { name: `bad-${label}`, ...extra } });
        t.equal(res.status, 422, label);
        t.equal(res.body.error, 'validation_failed', label);
        t.ok(res.body.details[path], `${label}: details name ${path} (got ${Object.keys(res.body.details)})`);
      }
      const missingName = await http.post('/api/environments', { token, body: {} });
      t.ok(missingName.body.details.name);
      const list = await http.get('/api/environments', { token });
      t.equal(list.body.data.length, 1, 'no bad environment was created');
      const dup = await http.post('/api/environments', { token, body: { name: 'web' } });
      t.equal(dup.status, 422);
      t.ok(dup.body.details.name, 'names are unique per account');
      const theirs = await http.post('/api/environments', { token: other.key, body: { name: 'web' } });
      t.equal(theirs.status, 201, 'another account may use the same name');
    });

    t.test('PUT and PATCH update the fields present', async (t) => {
      const env = (
        await http.post('/api/environments', {
          token,
          body: { name: 'upd', setup_script: 'make', env_vars: { A: '1' } },
        })
      ).body;
      const put = await http.put(`/api/environments/${env.id}`, { token, body: { env_vars: { B: '2' } } });
      t.equal(put.status, 200);
      t.same(put.body.env_vars, { B: '2' });
      t.equal(put.body.setup_script, 'make', 'an absent field is kept');
      const patch = await http.call('PATCH', `/api/environments/${env.id}`, {
        token,
        body: { networking_config: null },
      });
      t.equal(patch.body.networking_type, 'unrestricted');
      const rename = await http.put(`/api/environments/${env.id}`, { token, body: { name: 'web' } });
      t.equal(rename.status, 422, 'cannot take the name of another environment');
      t.same(rename.body.details, { name: ['is already used by another environment of this account'] });
      const same = await http.put(`/api/environments/${env.id}`, { token, body: { name: 'upd', setup_script: 'x' } });
      t.equal(same.body.setup_script, 'x', 'keeping its own name is no clash');
    });

    t.test("a vault may be renamed to its own name but not to another vault's: 422 naming name", async (t) => {
      const a = (await http.post('/api/vaults', { token, body: { name: 'clash-a' } })).body;
      await http.post('/api/vaults', { token, body: { name: 'clash-b' } });
      const same = await http.put(`/api/vaults/${a.id}`, { token, body: { name: 'clash-a' } });
      t.equal(same.status, 200);
      const taken = await http.put(`/api/vaults/${a.id}`, { token, body: { name: 'clash-b' } });
      t.equal(taken.status, 422);
      t.same(taken.body.details, { name: ['is already used by another vault of this account'] });
      t.equal((await http.get(`/api/vaults/${a.id}`, { token })).body.name, 'clash-a', 'nothing changed');
    });

    t.test('environment secrets are write-only, upserted by key, and counted', async (t) => {
      const env = (await http.post('/api/environments', { token, body: { name: 'sec' } })).body;
      const first = await http.post(`/api/environments/${env.id}/secrets`, {
        token,
        body: { key: 'DATABASE_URL', value: 'postgres://user:hunter2-secret@db/x' },
      });
      t.equal(first.status, 201);
      t.same(Object.keys(first.body).sort(), ['created_at', 'id', 'key', 'updated_at']);
      const again = await http.post(`/api/environments/${env.id}/secrets`, {
        token,
        body: { key: 'DATABASE_URL', value: 'postgres://user:other-secret@db/x' },
      });
      t.equal(again.status, 200, 'an existing key is updated');
      t.equal(again.body.id, first.body.id);
      const list = await http.get(`/api/environments/${env.id}/secrets`, { token });
      t.same(
        list.body.data.map((s: { key: string }) => s.key),
        ['DATABASE_URL'],
      );
      t.notMatch(list.text, /secret@db/, 'values are never returned');
      t.equal((await http.get(`/api/environments/${env.id}`, { token })).body.secret_count, 1);
      const rows = await svc.db.sql<{ ciphertext: Uint8Array }[]>`SELECT ciphertext FROM environment_secrets`;
      t.ok(
        rows.every((r) => !Buffer.from(r.ciphertext).toString('latin1').includes('secret@db')),
        'encrypted at rest',
      );
      const audit = await http.get('/api/audit?action_prefix=environment.secret.', { token });
      t.equal(audit.body.data[0].metadata.key, 'DATABASE_URL');
      t.notMatch(audit.text, /secret@db/, 'no value in the audit trail');

      const badKey = await http.post(`/api/environments/${env.id}/secrets`, {
        token,
        body: { key: 'has space', value: 'x' },
      });
      t.equal(badKey.status, 422);
      const empty = await http.post(`/api/environments/${env.id}/secrets`, {
        token,
        body: { key: 'EMPTY', value: '' },
      });
      t.equal(empty.status, 422);
      t.equal((await http.delete(`/api/environments/${env.id}/secrets/DATABASE_URL`, { token })).status, 204);
      t.equal((await http.delete(`/api/environments/${env.id}/secrets/DATABASE_URL`, { token })).status, 404);
    });

    t.test('vaults: CRUD, secrets with expiry, retire seam on delete', async (t) => {
      const vault = await http.post('/api/vaults', { token, body: { name: 'prod' } });
      t.equal(vault.status, 201);
      t.match(vault.body, { name: 'prod', secret_count: 0 });
      const past = new Date(Date.now() - 60_000).toISOString();
      await http.post(`/api/vaults/${vault.body.id}/secrets`, {
        token,
        body: { key: 'OLD_TOKEN', value: 'old-value-1234', expires_at: past },
      });
      const live = await http.post(`/api/vaults/${vault.body.id}/secrets`, {
        token,
        body: { key: 'API_TOKEN', value: 'live-value-5678' },
      });
      t.equal(live.status, 201);
      t.equal(live.body.expires_at, null);
      const list = await http.get(`/api/vaults/${vault.body.id}/secrets`, { token });
      t.same(
        list.body.data.map((s: { key: string; expired: boolean; expires_at: string | null }) => [
          s.key,
          s.expired,
          s.expires_at !== null,
        ]),
        [
          ['API_TOKEN', false, false],
          ['OLD_TOKEN', true, true],
        ],
        'an expired secret stays listed with its expiry',
      );
      const { revealSecrets } = await import('../../gateway/src/services/secrets.ts');
      t.same(
        await revealSecrets({ sql: svc.db.sql, keyring: svc.keyring }, 'vault', me.accountId, vault.body.id),
        { API_TOKEN: 'live-value-5678' },
        'an expired secret is not placed into new sandboxes',
      );
      const renamed = await http.put(`/api/vaults/${vault.body.id}`, { token, body: { name: 'production' } });
      t.equal(renamed.body.name, 'production');
      t.equal((await http.get(`/api/vaults/${vault.body.id}`, { token })).body.secret_count, 2);
      const del = await http.delete(`/api/vaults/${vault.body.id}`, { token });
      t.equal(del.status, 204);
      t.equal((await http.get(`/api/vaults/${vault.body.id}`, { token })).status, 404);
      const rows = await svc.db.sql`SELECT 1 FROM vault_secrets WHERE vault_id = ${vault.body.id}`;
      t.equal(rows.length, 0, 'its secrets went with it');
    });

    t.test("another tenant's environments and vaults are 404 on every route", async (t) => {
      const env = (await http.post('/api/environments', { token: other.key, body: { name: 'theirs' } })).body;
      const vault = (await http.post('/api/vaults', { token: other.key, body: { name: 'theirs' } })).body;
      await http.post(`/api/environments/${env.id}/secrets`, {
        token: other.key,
        body: { key: 'K', value: 'v-123456' },
      });
      const calls: [string, string, unknown?][] = [
        ['GET', `/api/environments/${env.id}`],
        ['PUT', `/api/environments/${env.id}`, { setup_script: 'rm -rf /' }],
        ['DELETE', `/api/environments/${env.id}`],
        ['GET', `/api/environments/${env.id}/secrets`],
        ['POST', `/api/environments/${env.id}/secrets`, { key: 'K', value: 'stolen' }],
        ['DELETE', `/api/environments/${env.id}/secrets/K`],
        ['GET', `/api/vaults/${vault.id}`],
        ['PUT', `/api/vaults/${vault.id}`, { name: 'mine' }],
        ['DELETE', `/api/vaults/${vault.id}`],
        ['GET', `/api/vaults/${vault.id}/secrets`],
        ['POST', `/api/vaults/${vault.id}/secrets`, { key: 'K', value: 'stolen' }],
      ];
      for (const [method, path, body] of calls) {
        const res = await http.call(method, path, { token, ...(body ? { body } : {}) });
        t.equal(res.status, 404, `${method} ${path}`);
        const message = path.startsWith('/api/vaults') ? 'Vault not found.' : 'Environment not found.';
        t.same(res.body, { error: 'not_found', message }, `${method} ${path}`);
      }
      const still = await http.get(`/api/environments/${env.id}`, { token: other.key });
      t.equal(still.body.setup_script, '', 'nothing changed');
      t.equal(still.body.secret_count, 1);
    });
  });
}
