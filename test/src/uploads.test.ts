/**
 * Every client's uploads work through the edge: curl (which sends `Expect: 100-continue` for
 * bodies over 1 MB, as .NET and some Java clients do) and a raw socket, for bodies announced
 * too large, chunked bodies, and accepted ones, on avatars and prompt images.
 */
import { execFile } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { bigPng } from '../fixtures/images.ts';
import { signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';

const MB = 1024 * 1024;
const LIMIT = 3 * MB;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Curled {
  status: number;
  body: string;
  /** Every status line curl saw, interim ones included (`HTTP/1.1 100 Continue`). */
  statusLines: string[];
}

/** Runs curl with its defaults (so `Expect: 100-continue` for large bodies) and `args`. */
function curl(args: string[]): Promise<Curled> {
  return new Promise((resolve, reject) => {
    execFile(
      'curl',
      ['-sS', '-v', '--max-time', '30', '-w', '\n%{http_code}', ...args],
      { maxBuffer: 64 * MB, encoding: 'utf8' },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`curl failed: ${err.message}\n${stderr}`));
        const cut = stdout.lastIndexOf('\n');
        resolve({
          status: Number(stdout.slice(cut + 1)),
          body: stdout.slice(0, cut),
          statusLines: stderr
            .split('\n')
            .filter((l) => l.startsWith('< HTTP/'))
            .map((l) => l.slice(2).trim()),
        });
      },
    );
  });
}

/**
 * Sends `head`, then `body` after `waitBeforeBodyMs`; resolves with all it read once the server
 * closes the connection (send `connection: close` or expect a refusal).
 */
function rawExchange(port: number, head: string, body: Buffer, waitBeforeBodyMs = 0): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    const sock = connect(port, '127.0.0.1', async () => {
      sock.write(head);
      if (waitBeforeBodyMs) await sleep(waitBeforeBodyMs);
      // No half-close: uWS takes a client's FIN as the end of the connection.
      if (!sock.destroyed) sock.write(body);
    });
    sock.on('data', (d) => {
      got += d.toString('latin1');
    });
    sock.on('error', () => {});
    sock.on('close', () => resolve(got));
    sock.setTimeout(20_000, () => {
      sock.destroy();
      reject(new Error(`no end of answer within 20 s; read so far: ${got.slice(0, 300)}`));
    });
  });
}

t.test('uploads through the edge with curl and a raw socket', async (t) => {
  const svc = await startTestService(t, {
    env: {
      BODY_LIMIT_BYTES: String(LIMIT),
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '3000',
    },
  });
  const me = await signUp(svc);
  const token = me.key;
  const port = Number(new URL(svc.url).port);
  const { agent } = await claudeAgent(t, svc.http, token);
  const avatarUrl = `${svc.url}/api/agents/${agent.id}/avatar`;
  /** curl with its defaults sending `file` to `url` as `type`, chunked on request. */
  const send = (method: string, url: string, type: string, file: string, chunked = false) =>
    curl([
      ...['-H', `authorization: Bearer ${token}`, '-X', method, '-H', `content-type: ${type}`],
      ...(chunked ? ['-H', 'transfer-encoding: chunked'] : []),
      ...['--data-binary', `@${file}`, url],
    ]);
  const png = bigPng(2 * MB);
  const pngFile = join(svc.dataDir, 'avatar.png');
  await writeFile(pngFile, png);
  const storedAvatar = async () => {
    const res = await fetch(avatarUrl, { headers: { authorization: `Bearer ${token}` } });
    return res.status === 200 ? Buffer.from(await res.arrayBuffer()) : undefined;
  };

  t.test('curl with its defaults: a 2 MB avatar is accepted after 100 Continue', async (t) => {
    const res = await send('PUT', avatarUrl, 'image/png', pngFile);
    t.same(
      res.statusLines,
      ['HTTP/1.1 100 Continue', 'HTTP/1.1 200 OK'],
      'curl announced Expect and was told to go on',
    );
    t.equal(res.status, 200);
    t.equal(JSON.parse(res.body).avatar_media_type, 'image/png');
    t.same(await storedAvatar(), png, 'the stored avatar is the uploaded bytes');
  });

  t.test('curl, chunked: a 2 MB avatar is accepted', async (t) => {
    t.equal((await svc.http.delete(`/api/agents/${agent.id}/avatar`, { token })).status, 204);
    const res = await send('PUT', avatarUrl, 'image/png', pngFile, true);
    t.equal(res.status, 200);
    t.same(await storedAvatar(), png);
  });

  t.test('curl: a body announced over BODY_LIMIT_BYTES is 413 at once, and nothing changes', async (t) => {
    const before = await storedAvatar();
    const hugeFile = join(svc.dataDir, 'huge.png');
    await writeFile(hugeFile, bigPng(LIMIT + 1));
    const res = await send('PUT', avatarUrl, 'image/png', hugeFile);
    t.equal(res.status, 413);
    t.same(JSON.parse(res.body), {
      error: 'payload_too_large',
      message: `The request body is ${LIMIT + 1} bytes, more than the limit of ${LIMIT / 1024 / 1024} MB.`,
      limit_bytes: LIMIT,
    });
    t.equal(res.statusLines.at(-1), 'HTTP/1.1 413 Payload Too Large');
    t.same(await storedAvatar(), before, 'the avatar is unchanged');
  });

  t.test('curl, chunked: a body over BODY_LIMIT_BYTES is 413 with the error body', async (t) => {
    const hugeFile = join(svc.dataDir, 'huge-chunked.png');
    await writeFile(hugeFile, bigPng(LIMIT + MB));
    const res = await send('PUT', avatarUrl, 'image/png', hugeFile, true);
    t.equal(res.status, 413);
    t.equal(JSON.parse(res.body).error, 'payload_too_large');
  });

  t.test('a raw client that waits for 100 Continue before sending its body is answered', async (t) => {
    const got = await rawExchange(
      port,
      `PUT /api/agents/${agent.id}/avatar HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\n` +
        `content-type: image/png\r\ncontent-length: ${png.length}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n`,
      png,
      300,
    );
    t.match(got, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK\r\n/, '100 Continue, then the final answer');
    t.match(got, /"avatar_media_type":"image\/png"/);
  });

  t.test('a raw client announcing too much gets 413 with Connection: close, not a 503', async (t) => {
    const got = await rawExchange(
      port,
      `PUT /api/agents/${agent.id}/avatar HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\n` +
        `content-type: image/png\r\ncontent-length: ${LIMIT + 1}\r\nexpect: 100-continue\r\n\r\n`,
      Buffer.alloc(0),
      1000,
    );
    const final = got.slice(got.lastIndexOf('HTTP/1.1 '));
    t.match(final, /^HTTP\/1\.1 413 Payload Too Large\r\n/);
    t.match(final, /\r\nConnection: close\r\n/i);
    t.equal((final.match(/connection:/gi) ?? []).length, 1, 'one Connection header');
    t.match(final, /"error":"payload_too_large"/);
  });

  t.test(
    'curl: a prompt whose images pass BODY_LIMIT_BYTES is 413, announced or chunked, and nothing starts',
    async (t) => {
      const bodyFile = join(svc.dataDir, 'too-big-prompt.json');
      await writeFile(
        bodyFile,
        JSON.stringify({
          agent_id: agent.id,
          prompt: 'describe the picture',
          images: [{ data: bigPng(LIMIT).toString('base64'), media_type: 'image/png' }],
        }),
      );
      for (const chunked of [false, true]) {
        const res = await send('POST', `${svc.url}/api/conversations`, 'application/json', bodyFile, chunked);
        t.equal(res.status, 413, chunked ? 'chunked' : 'announced');
        t.equal(JSON.parse(res.body).error, 'payload_too_large');
      }
      t.same((await svc.http.get('/api/conversations', { token })).body.data, [], 'no conversation was started');
    },
  );

  t.test('curl with its defaults: a prompt with a 2 MB image starts a turn that holds the image', async (t) => {
    const image = bigPng(2 * MB);
    const bodyFile = join(svc.dataDir, 'prompt.json');
    await writeFile(
      bodyFile,
      JSON.stringify({
        agent_id: agent.id,
        prompt: 'describe the picture',
        images: [{ data: image.toString('base64'), media_type: 'image/png' }],
      }),
    );
    const res = await send('POST', `${svc.url}/api/conversations`, 'application/json', bodyFile);
    t.equal(res.statusLines[0], 'HTTP/1.1 100 Continue');
    t.equal(res.status, 201, res.body.slice(0, 300));
    const conversation = JSON.parse(res.body) as { id: string };
    const turns = (await svc.http.get(`/api/conversations/${conversation.id}/turns`, { token })).body.data as {
      id: string;
      image_count: number;
    }[];
    t.equal(turns[0]?.image_count, 1);
    const stored = await fetch(`${svc.url}/api/conversations/${conversation.id}/turns/${turns[0]?.id}/images/0`, {
      headers: { authorization: `Bearer ${token}` },
    });
    t.equal(stored.headers.get('content-type'), 'image/png');
    t.same(Buffer.from(await stored.arrayBuffer()), image, 'the turn holds the uploaded image');
    await svc.http.post(`/api/conversations/${conversation.id}/terminate`, { token });
  });
});
