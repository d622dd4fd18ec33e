import t from 'tap';
import { BMP, bigPng, JPEG, PNG } from '../fixtures/images.ts';
import { backends, signUp, startTestService } from './harness.ts';

const KB = 1024;
const MB = 1024 * 1024;

for (const backend of backends()) {
  t.test(`support reports on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend, env: { SUPPORT_FORWARD_INTERVAL_MS: '0' } });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    const report = (body: Record<string, unknown>, as = token) =>
      http.post('/api/support/reports', { token: as, body: { category: 'bug', message: 'It broke.', ...body } });

    t.test('a report is stored new, shows that a screenshot exists and never inlines it', async (t) => {
      const res = await report({
        category: 'stuck',
        message: 'The conversation stopped answering after the second prompt.',
        context: { conversation_id: 'cnv_x', app_version: '1.4.2', page_url: 'https://app.example/#/c/cnv_x' },
        client: 'svc-web 1.4.2',
        screenshot: { data: PNG.toString('base64'), media_type: 'image/png' },
      });
      t.equal(res.status, 201, res.text);
      t.match(res.body, {
        id: /^sup_/,
        category: 'stuck',
        status: 'new',
        message: 'The conversation stopped answering after the second prompt.',
        context: { conversation_id: 'cnv_x', app_version: '1.4.2', page_url: 'https://app.example/#/c/cnv_x' },
        client: 'svc-web 1.4.2',
        screenshot: { media_type: 'image/png', bytes: PNG.length },
        forwarded_at: null,
        external_url: null,
        forward_error: null,
      });
      t.notOk(res.text.includes(PNG.toString('base64')), 'the image bytes are not in the answer');
      const one = await http.get(`/api/support/reports/${res.body.id}`, { token });
      t.equal(one.status, 200);
      t.same(one.body, res.body);
      t.notOk(one.text.includes(PNG.toString('base64')));

      const later = await report({ message: 'A second one.' });
      const list = await http.get('/api/support/reports', { token });
      t.equal(list.status, 200);
      t.same(
        list.body.data.slice(0, 2).map((r: { id: string }) => r.id),
        [later.body.id, res.body.id],
        'newest first',
      );
      t.equal(list.body.data[1].screenshot.bytes, PNG.length);
      t.notOk(list.text.includes(PNG.toString('base64')));
      t.same(later.body.screenshot, null, 'no screenshot: null');
      t.same([later.body.context, later.body.client], [null, null]);
    });

    t.test('the message is at most 20 KB of UTF-8: one byte more is 413 naming the field', async (t) => {
      t.equal((await report({ message: 'a'.repeat(20 * KB) })).status, 201, 'exactly 20 KB is taken');
      const over = await report({ message: 'a'.repeat(20 * KB + 1) });
      t.equal(over.status, 413);
      t.same(over.body, {
        error: 'payload_too_large',
        message: 'message is 20481 bytes, more than the limit of 20 KB.',
        limit_bytes: 20480,
      });
      // 10,241 two-byte characters: fewer than 20 K characters, more than 20 KB.
      const wide = await report({ message: 'é'.repeat(10_241) });
      t.equal(wide.status, 413, 'counted in bytes, not characters');
      t.match(wide.body, { error: 'payload_too_large', message: /^message is 20482 bytes/ });
    });

    t.test('the context is at most 64 KB as JSON: one byte more is 413 naming the field', async (t) => {
      const sized = (bytes: number) => ({ notes: 'x'.repeat(bytes - '{"notes":""}'.length) });
      t.equal(JSON.stringify(sized(64 * KB)).length, 64 * KB);
      t.equal((await report({ context: sized(64 * KB) })).status, 201, 'exactly 64 KB is taken');
      const over = await report({ context: sized(64 * KB + 1) });
      t.equal(over.status, 413);
      t.same(over.body, {
        error: 'payload_too_large',
        message: 'context (as JSON) is 65537 bytes, more than the limit of 64 KB.',
        limit_bytes: 65536,
      });
    });

    t.test('the screenshot is at most 5 MB: one byte more is 413 naming the field', async (t) => {
      const exact = await report({ screenshot: { data: bigPng(5 * MB).toString('base64'), media_type: 'image/png' } });
      t.equal(exact.status, 201, 'exactly 5 MB is taken');
      t.same(exact.body.screenshot, { media_type: 'image/png', bytes: 5 * MB });
      const over = await report({
        screenshot: { data: bigPng(5 * MB + 1).toString('base64'), media_type: 'image/png' },
      });
      t.equal(over.status, 413);
      t.same(over.body, {
        error: 'payload_too_large',
        message: 'screenshot is 5242881 bytes, more than the limit of 5 MB.',
        limit_bytes: 5242880,
      });
    });

    t.test('the screenshot type is judged by its bytes, not its label: 415', async (t) => {
      const bmp = await report({ screenshot: { data: BMP.toString('base64'), media_type: 'image/png' } });
      t.equal(bmp.status, 415);
      t.same(bmp.body, {
        error: 'unsupported_media_type',
        message: 'screenshot is not an image of image/png, image/jpeg, image/gif, image/webp.',
      });
      const mislabelled = await report({ screenshot: { data: PNG.toString('base64'), media_type: 'image/jpeg' } });
      t.equal(mislabelled.status, 415);
      t.same(mislabelled.body, {
        error: 'unsupported_media_type',
        message: 'screenshot is image/png, not image/jpeg.',
      });
      const svg = await report({ screenshot: { data: PNG.toString('base64'), media_type: 'image/svg+xml' } });
      t.equal(svg.status, 415);
      t.match(svg.body, { error: 'unsupported_media_type', message: 'screenshot is image/png, not image/svg+xml.' });
      const jpeg = await report({ screenshot: { data: JPEG.toString('base64'), media_type: 'image/jpeg' } });
      t.equal(jpeg.status, 201, 'a jpeg labelled jpeg is taken');
      t.same(jpeg.body.screenshot, { media_type: 'image/jpeg', bytes: JPEG.length });
    });

    t.test('a malformed report is 422 with details; no credentials is 401', async (t) => {
      const category = await report({ category: 'complaint' });
      t.equal(category.status, 422);
      t.match(category.body, { error: 'validation_failed', details: { category: [/./] } });
      const empty = await report({ message: '' });
      t.equal(empty.status, 422);
      t.match(empty.body, { error: 'validation_failed', details: { message: [/./] } });
      const notBase64 = await report({ screenshot: { data: 'not base64!', media_type: 'image/png' } });
      t.equal(notBase64.status, 422);
      t.match(notBase64.body, { error: 'validation_failed', details: { 'screenshot.data': [/./] } });
      const contextList = await report({ context: ['a'] });
      t.equal(contextList.status, 422);
      t.match(contextList.body, { error: 'validation_failed', details: { context: [/./] } });
      for (const depth of [33, 5000]) {
        // A context nested this deep, sent as raw JSON.
        const deep = await http.post('/api/support/reports', {
          token,
          rawBody: `{"category":"bug","message":"x","context":{"a":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}}`,
          headers: { 'content-type': 'application/json' },
        });
        t.equal(deep.status, 422, `nested ${depth} deep`);
        t.same(deep.body.details, { context: ['nests objects and arrays deeper than 32 levels'] });
      }
      t.equal((await report({ context: { a: [[[[{ b: 1 }]]]] } })).status, 201, 'a shallower nesting is taken');
      const anonymous = await http.post('/api/support/reports', { body: { category: 'bug', message: 'x' } });
      t.equal(anonymous.status, 401);
      t.match(anonymous.body, { error: 'unauthorized' });
    });

    t.test("another account's report is 404, and is not listed", async (t) => {
      const mine = await report({ message: 'mine alone' });
      const theirs = await http.get(`/api/support/reports/${mine.body.id}`, { token: other.key });
      t.equal(theirs.status, 404);
      t.same(theirs.body, { error: 'not_found', message: 'Support report not found.' });
      const unknown = await http.get('/api/support/reports/sup_nothing', { token });
      t.same([unknown.status, unknown.body], [404, theirs.body], 'answered exactly as an unknown id');
      const list = await http.get('/api/support/reports', { token: other.key });
      t.same(list.body, { data: [] });
    });

    t.test('the audit row carries category, sizes and context keys, never the message', async (t) => {
      const message = 'Secretive words that must stay out of the audit trail.';
      const res = await report({
        category: 'idea',
        message,
        context: { page_url: 'https://app.example/', app_version: '2.0.0' },
        screenshot: { data: PNG.toString('base64'), media_type: 'image/png' },
      });
      const audit = await http.get('/api/audit?action_prefix=support.', { token });
      const row = audit.body.data.find((r: { resource_id: string }) => r.resource_id === res.body.id);
      t.match(row, { action: 'support.report.created', actor: 'api', resource_type: 'support_report' });
      t.same(row.metadata, {
        category: 'idea',
        message_bytes: Buffer.byteLength(message),
        context_bytes: JSON.stringify({ page_url: 'https://app.example/', app_version: '2.0.0' }).length,
        context_keys: ['app_version', 'page_url'],
        screenshot_bytes: PNG.length,
        screenshot_media_type: 'image/png',
      });
      t.notOk(audit.text.includes('Secretive'), 'no word of the message in the audit trail');
      const theirs = await http.get('/api/audit?action_prefix=support.', { token: other.key });
      t.same(theirs.body.data, [], "not in another account's trail");
    });

    t.test('secrets pasted into a report are stored redacted', async (t) => {
      const env = await http.post('/api/environments', {
        token,
        body: { name: 'support-env', env_vars: { NODE_ENV: 'production' } },
      });
      t.equal(env.status, 201, env.text);
      await http.post(`/api/environments/${env.body.id}/secrets`, {
        token,
        body: { key: 'DB_PASSWORD', value: 'env-secret-5a4b3c2d' },
      });
      const vault = await http.post('/api/vaults', { token, body: { name: 'support-vault' } });
      await http.post(`/api/vaults/${vault.body.id}/secrets`, {
        token,
        body: { key: 'DEPLOY_TOKEN', value: 'vault-value-9f8e7d6c' },
      });
      const res = await report({
        message: `My key ${token} and the deploy token vault-value-9f8e7d6c do not work; env-secret-5a4b3c2d neither, in production.`,
        context: { api_key: 'short', nested: { Authorization: 'Bearer anything', note: 'has vault-value-9f8e7d6c' } },
      });
      t.equal(res.status, 201, res.text);
      t.equal(
        res.body.message,
        'My key [REDACTED] and the deploy token [REDACTED] do not work; [REDACTED] neither, in production.',
        'secrets go; a plain environment variable (production) stays',
      );
      t.same(res.body.context, {
        api_key: '[REDACTED]',
        nested: { Authorization: '[REDACTED]', note: 'has [REDACTED]' },
      });
      const stored = await http.get(`/api/support/reports/${res.body.id}`, { token });
      t.notOk(stored.text.includes(token) || stored.text.includes('vault-value-9f8e7d6c'));
    });
  });
}
