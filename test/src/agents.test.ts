import t from 'tap';
import { BMP, bigPng, GIF, JPEG, PNG, WEBP } from '../fixtures/images.ts';
import { startFakeImages } from './fakes/openai-images.ts';
import { retireSpy, signUp, startTestService } from './harness.ts';

t.test('agents', async (t) => {
  const images = await startFakeImages();
  t.teardown(() => images.close());
  const spy = retireSpy();
  const retired = spy.calls;
  const svc = await startTestService(t, {
    env: { OPENAI_BASE_URL: images.url, APP_CONVERSATIONS_URL: 'https://app.example/c', BODY_LIMIT_BYTES: '9000000' },
    overrides: { retireSandboxes: spy.retireSandboxes },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const other = await signUp(svc);
  const token = me.key;
  const env = (await http.post('/api/environments', { token, body: { name: 'main' } })).body;
  const env2 = (await http.post('/api/environments', { token, body: { name: 'second' } })).body;
  const vault = (await http.post('/api/vaults', { token, body: { name: 'v' } })).body;
  const theirEnv = (await http.post('/api/environments', { token: other.key, body: { name: 'x' } })).body;
  const theirVault = (await http.post('/api/vaults', { token: other.key, body: { name: 'x' } })).body;

  const full = {
    name: 'coder',
    description: 'writes code',
    system: 'You are careful.',
    runtime: 'claude',
    model: 'anthropic/claude-sonnet-4-5',
    environment_id: env.id,
    skills: [
      { source: 'github.com/acme/skills/lint', ref: 'v1' },
      { name: 'style-guide', content: '# Style\nBe brief.' },
    ],
    mcp_servers: { files: { command: 'npx', args: ['-y', '@modelcontextprotocol/server-filesystem', '.'] } },
    sandbox_provider: 'runner',
    sandbox_mode: 'persistent',
    allowed_vault_ids: [vault.id],
    allowed_environment_ids: [],
    permission_policy: { default: 'auto_allow', ask: ['execute', 'Bash'] },
  };

  t.test('an agent with every field is created and read back', async (t) => {
    const res = await http.post('/api/agents', { token, body: full });
    t.equal(res.status, 201);
    t.match(res.body, { ...full, avatar_media_type: null, conversation_count: 0 });
    const got = await http.get(`/api/agents/${res.body.id}`, { token });
    t.same(got.body, res.body);
    t.equal((await http.get(`/api/environments/${env.id}`, { token })).body.agent_count, 1);
  });

  t.test('defaults: sandbox_mode ephemeral, null allowlists, auto_allow policy', async (t) => {
    const res = await http.post('/api/agents', {
      token,
      body: { name: 'minimal', runtime: 'codex', model: 'openai/gpt-5-codex', environment_id: env.id },
    });
    t.equal(res.status, 201);
    t.match(res.body, {
      sandbox_mode: 'ephemeral',
      sandbox_provider: null,
      allowed_vault_ids: null,
      allowed_environment_ids: null,
      skills: [],
      mcp_servers: {},
      permission_policy: { default: 'auto_allow', ask: [] },
    });
  });

  t.test('the model provider must belong to the runtime; the model itself is never checked', async (t) => {
    const ok = [
      ['gemini', 'google/gemini-9-imaginary'],
      ['opencode', 'openrouter/qwen/qwen3-coder'],
      ['opencode', 'anthropic/claude-anything'],
    ];
    for (const [runtime, model] of ok) {
      const res = await http.post('/api/agents', {
        token,
        body: { name: `ok-${model}`, runtime, model, environment_id: env.id },
      });
      t.equal(res.status, 201, `${runtime} ${model}`);
    }
    const bad = [
      ['claude', 'openai/gpt-5', 'provider must be anthropic for runtime claude'],
      ['codex', 'anthropic/claude-sonnet-4-5', 'provider must be openai for runtime codex'],
      ['opencode', 'madeup/model', 'unknown provider madeup'],
      ['claude', 'no-slash', 'must be provider/model_id'],
    ];
    for (const [runtime, model, message] of bad) {
      const res = await http.post('/api/agents', {
        token,
        body: { name: `bad-${model}`, runtime, model, environment_id: env.id },
      });
      t.equal(res.status, 422, `${runtime} ${model}`);
      t.match(res.body.details.model.join(' '), message);
    }
  });

  t.test('each malformed field is 422 naming it', async (t) => {
    const base = { name: 'm', runtime: 'claude', model: 'anthropic/x', environment_id: env.id };
    const cases: [string, Record<string, unknown>, string][] = [
      ['runtime', { runtime: 'cursor' }, 'runtime'],
      ['both skill shapes', { skills: [{ source: 'a', name: 'b', content: 'c' }] }, 'skills.0'],
      ['name without content', { skills: [{ name: 'b' }] }, 'skills.0'],
      ['ref without source', { skills: [{ ref: 'v1', name: 'b', content: 'c' }] }, 'skills.0'],
      ['mcp without command', { mcp_servers: { x: { args: [] } } }, 'mcp_servers.x.command'],
      ['sandbox provider', { sandbox_provider: 'aws' }, 'sandbox_provider'],
      ['sandbox mode', { sandbox_mode: 'forever' }, 'sandbox_mode'],
      ['policy default', { permission_policy: { default: 'deny_all' } }, 'permission_policy.default'],
      ['policy unknown key', { permission_policy: { allow: ['x'] } }, 'permission_policy'],
      ['unknown field', { temperature: 2 }, '(body)'],
      ['allowlist type', { allowed_vault_ids: 'all' }, 'allowed_vault_ids'],
    ];
    for (const [label, extra, path] of cases) {
      const res = await http.post('/api/agents', { token, body: { ...base, ...extra } });
      t.equal(res.status, 422, label);
      t.ok(res.body.details?.[path], `${label}: details name ${path} (got ${Object.keys(res.body.details ?? {})})`);
    }
    const missing = await http.post('/api/agents', { token, body: { name: 'x' } });
    t.equal(missing.status, 422);
    t.ok(missing.body.details.runtime && missing.body.details.model && missing.body.details.environment_id);
  });

  t.test('a sandbox provider this instance does not offer is 422 when the agent is saved', async (t) => {
    const base = { name: 'cloudy', runtime: 'claude', model: 'anthropic/x', environment_id: env.id };
    const refused = (res: { status: number; body: Record<string, any> }, provider: string) => {
      t.equal(res.status, 422, provider);
      t.equal(res.body.error, 'validation_failed');
      t.match(res.body.details?.sandbox_provider?.join(' '), new RegExp(`${provider} is not offered by this instance`));
      t.match(res.body.details?.sandbox_provider?.join(' '), /offers runner/);
    };
    for (const provider of ['sprites', 'e2b', 'daytona']) {
      refused(await http.post('/api/agents', { token, body: { ...base, sandbox_provider: provider } }), provider);
    }
    t.same((await http.get('/api/agents?search=cloudy', { token })).body.data, [], 'no agent was stored');
    const agent = (await http.get('/api/agents?search=coder', { token })).body.data[0];
    refused(await http.put(`/api/agents/${agent.id}`, { token, body: { sandbox_provider: 'e2b' } }), 'e2b');
    t.equal((await http.get(`/api/agents/${agent.id}`, { token })).body.sandbox_provider, 'runner', 'unchanged');
    const applied = await http.post('/api/apply', {
      token,
      body: {
        resources: [{ kind: 'Agent', name: 'cloudy', spec: { ...base, name: undefined, sandbox_provider: 'daytona' } }],
      },
    });
    t.equal(applied.status, 200);
    t.equal(applied.body.data[0].action, 'error');
    t.match(applied.body.data[0].errors.sandbox_provider.join(' '), /daytona is not offered by this instance/);
    const ok = await http.post('/api/agents', { token, body: { ...base, sandbox_provider: 'runner' } });
    t.equal(ok.status, 201, 'runner is offered');
    t.equal((await http.delete(`/api/agents/${ok.body.id}`, { token })).status, 204);
  });

  t.test("ids inside the body must be the caller's: 404 for another tenant's", async (t) => {
    const base = { name: 'refs', runtime: 'claude', model: 'anthropic/x', environment_id: env.id };
    for (const extra of [
      { environment_id: theirEnv.id },
      { allowed_environment_ids: [theirEnv.id] },
      { allowed_vault_ids: [theirVault.id] },
      { allowed_vault_ids: ['vlt_doesnotexist'] },
    ]) {
      const res = await http.post('/api/agents', { token, body: { ...base, ...extra } });
      t.equal(res.status, 404, JSON.stringify(extra));
      t.equal(res.body.error, 'not_found');
    }
  });

  t.test("an environment the agent's own allowlist leaves out is 422", async (t) => {
    const base = { name: 'allow', runtime: 'claude', model: 'anthropic/x', environment_id: env.id };
    const res = await http.post('/api/agents', { token, body: { ...base, allowed_environment_ids: [env2.id] } });
    t.equal(res.status, 422);
    t.ok(res.body.details.environment_id);
    const both = await http.post('/api/agents', {
      token,
      body: { ...base, allowed_environment_ids: [env.id, env2.id] },
    });
    t.equal(both.status, 201);
    t.equal((await http.delete(`/api/agents/${both.body.id}`, { token })).status, 204);
  });

  t.test('filters: search, runtime, environment_id, has_skills, has_mcp', async (t) => {
    const names = async (q: string) =>
      (await http.get(`/api/agents?${q}`, { token })).body.data.map((a: { name: string }) => a.name).sort();
    t.same(await names('search=WRITES'), ['coder'], 'search matches the description, case-insensitively');
    t.same(await names('runtime=codex'), ['minimal']);
    t.same(await names('has_skills=true'), ['coder']);
    t.same(await names('has_mcp=true'), ['coder']);
    t.ok((await names('has_mcp=false')).includes('minimal'));
    t.equal((await names(`environment_id=${env2.id}`)).length, 0);
    t.equal((await http.get('/api/agents?runtime=cursor', { token })).status, 400, 'a bad filter is 400');
    t.same(await names('search=%25'), [], '% is literal');
  });

  t.test('PUT and PATCH update fields; a new environment_id calls the retire seam', async (t) => {
    const agent = (await http.get('/api/agents?search=coder', { token })).body.data[0];
    const put = await http.put(`/api/agents/${agent.id}`, { token, body: { description: 'reviews code' } });
    t.equal(put.status, 200);
    t.equal(put.body.description, 'reviews code');
    t.equal(put.body.model, agent.model, 'absent fields are kept');
    t.equal(retired.length, 0, 'no retirement without an environment change');
    const bad = await http.call('PATCH', `/api/agents/${agent.id}`, { token, body: { runtime: 'gemini' } });
    t.equal(bad.status, 422, 'the merged agent is validated: gemini cannot run an anthropic model');
    const moved = await http.call('PATCH', `/api/agents/${agent.id}`, { token, body: { environment_id: env2.id } });
    t.equal(moved.status, 200);
    t.same(retired, [
      { accountId: me.accountId, agentId: agent.id, environmentId: env.id, reason: 'agent_environment_changed' },
    ]);
  });

  t.test("an update may keep the agent's own name but not take another agent's: 422 naming name", async (t) => {
    const base = { runtime: 'claude', model: 'anthropic/x', environment_id: env.id };
    const a = (await http.post('/api/agents', { token, body: { ...base, name: 'clash-a' } })).body;
    await http.post('/api/agents', { token, body: { ...base, name: 'clash-b' } });
    const same = await http.put(`/api/agents/${a.id}`, { token, body: { name: 'clash-a', system: 'kept name' } });
    t.equal(same.status, 200);
    t.equal(same.body.system, 'kept name');
    const taken = await http.call('PATCH', `/api/agents/${a.id}`, { token, body: { name: 'clash-b' } });
    t.equal(taken.status, 422);
    t.same(taken.body.details, { name: ['is already used by another agent of this account'] });
    t.equal((await http.get(`/api/agents/${a.id}`, { token })).body.name, 'clash-a', 'nothing changed');
  });

  t.test('an environment in use cannot be deleted; once free, deleting it calls the retire seam', async (t) => {
    const inUse = await http.delete(`/api/environments/${env2.id}`, { token });
    t.equal(inUse.status, 409);
    t.equal(inUse.body.error, 'environment_in_use');
    const lonely = (await http.post('/api/environments', { token, body: { name: 'lonely' } })).body;
    retired.length = 0;
    t.equal((await http.delete(`/api/environments/${lonely.id}`, { token })).status, 204);
    t.same(retired, [{ accountId: me.accountId, environmentId: lonely.id, reason: 'environment_deleted' }]);
    retired.length = 0;
    const v = (await http.post('/api/vaults', { token, body: { name: 'gone' } })).body;
    t.equal((await http.delete(`/api/vaults/${v.id}`, { token })).status, 204);
    t.same(retired, [{ accountId: me.accountId, vaultId: v.id, reason: 'vault_deleted' }]);
  });

  t.test('avatars: each allowed type by raw bytes or JSON, judged by the signature', async (t) => {
    const agent = (await http.get('/api/agents?search=coder', { token })).body.data[0];
    const url = `/api/agents/${agent.id}/avatar`;
    for (const [type, bytes] of [
      ['image/png', PNG],
      ['image/jpeg', JPEG],
      ['image/gif', GIF],
      ['image/webp', WEBP],
    ] as const) {
      const put = await http.put(url, { token, rawBody: bytes, headers: { 'content-type': type } });
      t.equal(put.status, 200, type);
      t.equal(put.body.avatar_media_type, type);
      const get = await fetch(`${svc.url}${url}`, { headers: { authorization: `Bearer ${token}` } });
      t.equal(get.headers.get('content-type'), type);
      t.equal(get.headers.get('x-content-type-options'), 'nosniff');
      t.match(get.headers.get('content-security-policy') ?? '', /sandbox/);
      t.same(Buffer.from(await get.arrayBuffer()), bytes, 'the same bytes come back');
    }
    const json = await http.put(url, { token, body: { data: PNG.toString('base64'), media_type: 'image/png' } });
    t.equal(json.status, 200);
    t.equal(json.body.avatar_media_type, 'image/png');
  });

  t.test('avatars: wrong types are 415, oversize is 413, and nothing changes', async (t) => {
    const agent = (await http.get('/api/agents?search=coder', { token })).body.data[0];
    const url = `/api/agents/${agent.id}/avatar`;
    const cases: [string, Buffer, string][] = [
      ['a bmp', BMP, 'image/bmp'],
      ['a bmp claiming png', BMP, 'image/png'],
      ['png bytes claiming jpeg', PNG, 'image/jpeg'],
      ['text', Buffer.from('hello'), 'text/plain'],
    ];
    for (const [label, bytes, type] of cases) {
      const res = await http.put(url, { token, rawBody: bytes, headers: { 'content-type': type } });
      t.equal(res.status, 415, label);
      t.equal(res.body.error, 'unsupported_media_type');
    }
    const svg = await http.put(url, {
      token,
      body: { data: Buffer.from('<svg/>').toString('base64'), media_type: 'image/svg+xml' },
    });
    t.equal(svg.status, 415);
    const big = await http.put(url, {
      token,
      rawBody: bigPng(5 * 1024 * 1024 + 1),
      headers: { 'content-type': 'image/png' },
    });
    t.equal(big.status, 413);
    t.equal(big.body.error, 'payload_too_large');
    const bigJson = await http.put(url, {
      token,
      body: { data: bigPng(5 * 1024 * 1024 + 1).toString('base64'), media_type: 'image/png' },
    });
    t.equal(bigJson.status, 413);
    const exact = await http.put(url, {
      token,
      rawBody: bigPng(5 * 1024 * 1024),
      headers: { 'content-type': 'image/png' },
    });
    t.equal(exact.status, 200, 'exactly 5 MB is accepted');
    t.equal((await http.get(`/api/agents/${agent.id}`, { token })).body.avatar_media_type, 'image/png');
  });

  t.test('a stored type that is not an image is rechecked at serve time: 404', async (t) => {
    const agent = (await http.get('/api/agents?search=coder', { token })).body.data[0];
    await svc.db.sql`UPDATE agent_avatars SET media_type = 'text/html' WHERE agent_id = ${agent.id}`;
    t.equal((await http.get(`/api/agents/${agent.id}/avatar`, { token })).status, 404);
    t.equal((await http.delete(`/api/agents/${agent.id}/avatar`, { token })).status, 204);
    t.equal((await http.get(`/api/agents/${agent.id}`, { token })).body.avatar_media_type, null);
  });

  t.test('avatar generation uses the tenant OpenAI key; 422 no_openai_key without one', async (t) => {
    const none = await http.post('/api/avatars/generate', { token, body: { base: 'fox', mood: 'curious' } });
    t.equal(none.status, 422);
    t.equal(none.body.error, 'no_openai_key');
    await http.put('/api/account/inference-credentials/openai_api_key', {
      token,
      body: { value: 'bad-key-123', validate: false },
    });
    const refused = await http.post('/api/avatars/generate', { token, body: { base: 'fox', mood: 'curious' } });
    t.equal(refused.status, 424);
    t.equal(refused.body.channel, 'openai');
    await http.put('/api/account/inference-credentials/openai_api_key', {
      token,
      body: { value: 'good-key-123', validate: false },
    });
    const made = await http.post('/api/avatars/generate', { token, body: { base: 'fox', mood: 'curious' } });
    t.equal(made.status, 200);
    t.equal(made.body.media_type, 'image/png');
    t.same(Buffer.from(made.body.data, 'base64'), PNG);
    t.match(images.requests.at(-1)?.prompt, /curious fox/);
    const badMood = await http.post('/api/avatars/generate', { token, body: { base: 'fox', mood: 'angry' } });
    t.equal(badMood.status, 422);
  });

  t.test('the catalog lists runtimes, providers and apps from configuration', async (t) => {
    const res = await http.get('/api/catalog', { token });
    t.equal(res.status, 200);
    t.same(
      res.body.runtimes.map((r: { id: string }) => r.id),
      ['claude', 'codex', 'gemini', 'opencode'],
    );
    t.same(res.body.runtimes[0].providers, ['anthropic']);
    t.same(res.body.sandbox_providers, ['runner'], 'the providers this instance offers that an agent may name');
    t.equal(res.body.sandbox_provider_default, 'local', 'agents naming none run on local');
    t.same(res.body.package_managers, ['apt', 'npm']);
    t.ok(res.body.avatar.bases.includes('fox') && res.body.avatar.moods.includes('curious'));
    t.same(res.body.apps, { conversations: 'https://app.example/c', team: null });
  });

  t.test("another tenant's agent is 404 on every route", async (t) => {
    const theirs = (
      await http.post('/api/agents', {
        token: other.key,
        body: { name: 'theirs', runtime: 'claude', model: 'anthropic/x', environment_id: theirEnv.id },
      })
    ).body;
    for (const [method, path, body] of [
      ['GET', `/api/agents/${theirs.id}`],
      ['PUT', `/api/agents/${theirs.id}`, { name: 'mine' }],
      ['PATCH', `/api/agents/${theirs.id}`, { name: 'mine' }],
      ['DELETE', `/api/agents/${theirs.id}`],
      ['GET', `/api/agents/${theirs.id}/avatar`],
      ['DELETE', `/api/agents/${theirs.id}/avatar`],
    ] as [string, string, unknown?][]) {
      const res = await http.call(method, path, { token, ...(body ? { body } : {}) });
      t.equal(res.status, 404, `${method} ${path}`);
      const message = method === 'GET' && path.endsWith('/avatar') ? 'No avatar.' : 'Agent not found.';
      t.same(res.body, { error: 'not_found', message }, `${method} ${path}`);
    }
    const put = await http.put(`/api/agents/${theirs.id}/avatar`, {
      token,
      rawBody: PNG,
      headers: { 'content-type': 'image/png' },
    });
    t.equal(put.status, 404);
    t.equal((await http.get(`/api/agents/${theirs.id}`, { token: other.key })).body.name, 'theirs');
  });

  t.test('every mutation is audited without content', async (t) => {
    const audit = await http.get('/api/audit?action_prefix=agent.&limit=500', { token });
    const actions = new Set(audit.body.data.map((r: { action: string }) => r.action));
    for (const a of ['agent.created', 'agent.updated', 'agent.avatar.updated', 'agent.avatar.deleted'])
      t.ok(actions.has(a), a);
    t.notMatch(audit.text, /You are careful/, 'no system prompt in the trail');
  });

  t.test('deleting an agent frees its environment', async (t) => {
    const agents = (await http.get(`/api/agents?environment_id=${env2.id}`, { token })).body.data;
    for (const a of agents) t.equal((await http.delete(`/api/agents/${a.id}`, { token })).status, 204);
    t.equal((await http.delete(`/api/environments/${env2.id}`, { token })).status, 204);
  });
});
