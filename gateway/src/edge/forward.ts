import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { STATUS_CODES } from 'node:http';
import { Readable } from 'node:stream';
import { ApiError } from '@svc/core';
import type { Logger } from 'pino';
import { type Dispatcher, Pool } from 'undici';
import { CLIENT_IP_HEADER } from '../api/app.ts';
import { writeError } from './respond.ts';

/** Headers that describe one hop, never forwarded (RFC 9110 7.6.1), plus our own trusted one. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  CLIENT_IP_HEADER,
]);

export interface Forwarder {
  /**
   * Forwards one request to the api role, streaming both bodies with backpressure: the
   * client's upload is paused while the api is not reading, and the api's response is paused
   * while the client is not reading. Must be called synchronously inside the uWS handler (it
   * reads the request, which uWS frees on return). `admit` decides, possibly asynchronously,
   * whether the request may go on; a refusal is answered as the ApiError it resolves to.
   */
  forward(
    res: HttpResponse,
    req: HttpRequest,
    clientIp: string,
    admit: () => ApiError | undefined | Promise<ApiError | undefined>,
  ): void;
  /** Requests under way (for draining on shutdown). */
  readonly inFlight: number;
  close(): Promise<void>;
}

export function createForwarder(upstream: { socketPath: string } | { origin: string }, log: Logger): Forwarder {
  const pool =
    'socketPath' in upstream
      ? new Pool('http://api.internal', {
          connect: { socketPath: upstream.socketPath },
          connections: 512,
          pipelining: 1,
          keepAliveTimeout: 30_000,
        })
      : new Pool(upstream.origin, { connections: 512, pipelining: 1, keepAliveTimeout: 30_000 });
  let inFlight = 0;

  function forward(
    res: HttpResponse,
    req: HttpRequest,
    clientIp: string,
    admit: () => ApiError | undefined | Promise<ApiError | undefined>,
  ) {
    const method = req.getCaseSensitiveMethod().toUpperCase();
    const query = req.getQuery();
    const path = query ? `${req.getUrl()}?${query}` : req.getUrl();
    const headers: string[] = [];
    let hasBody = false;
    req.forEach((name, value) => {
      if (HOP_BY_HOP.has(name)) {
        if (name === 'transfer-encoding') hasBody = true;
        return;
      }
      if (name === 'content-length' && value !== '0') hasBody = true;
      headers.push(name, value);
    });
    headers.push(CLIENT_IP_HEADER, clientIp);

    inFlight++;
    let done = false;
    let aborted = false;
    const finish = () => {
      if (!done) {
        done = true;
        inFlight--;
      }
    };
    const abort = new AbortController();
    res.onAborted(() => {
      aborted = true;
      abort.abort();
      finish();
    });

    let body: Readable | undefined;
    if (hasBody) {
      let paused = false;
      body = new Readable({
        read() {
          if (paused && !aborted) {
            paused = false;
            res.resume();
          }
        },
      });
      const upload = body;
      res.onData((chunk, isLast) => {
        // uWS frees the ArrayBuffer after this callback returns, so copy it out.
        if (chunk.byteLength > 0 && !upload.push(Buffer.from(chunk.slice(0))) && !isLast) {
          paused = true;
          res.pause();
        }
        if (isLast) upload.push(null);
      });
    }

    const go = async () => {
      const refusal = await admit();
      if (aborted) return;
      if (refusal) {
        res.cork(() => writeError(res, refusal));
        body?.destroy();
        return finish();
      }
      let upstreamRes: Dispatcher.ResponseData;
      try {
        upstreamRes = await pool.request({
          path,
          method: method as 'GET',
          headers,
          body: body ?? null,
          signal: abort.signal,
          headersTimeout: 0,
          bodyTimeout: 0,
        });
      } catch (err) {
        if (aborted) return;
        log.error(
          { err: { message: (err as Error).message, code: (err as { code?: string }).code } },
          'api role unreachable',
        );
        res.cork(() => writeError(res, new ApiError('api_unavailable')));
        return finish();
      }
      if (aborted) {
        upstreamRes.body.destroy();
        return;
      }
      relayResponse(res, method, upstreamRes, () => aborted, finish);
    };
    go().catch((err) => {
      log.error({ err }, 'forwarding failed');
      if (!aborted && !done) res.cork(() => res.close());
      finish();
    });
  }

  return {
    forward,
    get inFlight() {
      return inFlight;
    },
    close: () => pool.close(),
  };
}

function relayResponse(
  res: HttpResponse,
  method: string,
  upstream: Dispatcher.ResponseData,
  isAborted: () => boolean,
  finish: () => void,
): void {
  const { statusCode, headers, body } = upstream;
  const lengthHeader = headers['content-length'];
  const length = typeof lengthHeader === 'string' ? Number(lengthHeader) : undefined;
  const noBody = method === 'HEAD' || statusCode === 204 || statusCode === 304;
  let ended = false;
  const end = () => {
    if (!ended) {
      ended = true;
      finish();
    }
  };
  // Destroying an undici body emits an abort error; a failure mid-body cuts the connection so
  // the client sees a truncated response, never a silently short one.
  body.on('error', () => {
    if (!isAborted() && !ended) res.cork(() => res.close());
    end();
  });

  res.cork(() => {
    res.writeStatus(`${statusCode} ${STATUS_CODES[statusCode] ?? ''}`);
    for (const [name, value] of Object.entries(headers)) {
      if (value === undefined || name === 'content-length' || name === 'date' || HOP_BY_HOP.has(name)) continue;
      if (Array.isArray(value)) for (const v of value) res.writeHeader(name, v);
      else res.writeHeader(name, value);
    }
    if (noBody) {
      res.endWithoutBody(method === 'HEAD' ? length : undefined);
      end();
      // dump(), not destroy(): destroying an undici body builds an abort error with a stack.
      void body.dump().catch(() => {});
    }
  });
  if (noBody) return;

  if (length !== undefined && Number.isFinite(length)) {
    // Known length: tryEnd streams with Content-Length; on backpressure keep the unsent tail
    // and pause the api's body until uWS reports the socket writable again.
    body.on('data', (chunk: Buffer) => {
      if (isAborted() || ended) return;
      res.cork(() => {
        const startOffset = res.getWriteOffset();
        const [ok, responded] = res.tryEnd(chunk, length);
        if (responded) {
          end(); // the whole announced length is out; the body ends by itself
        } else if (!ok) {
          body.pause();
          res.onWritable((offset) => {
            const [ok2, responded2] = res.tryEnd(chunk.subarray(offset - startOffset), length);
            if (responded2) {
              end();
              body.resume();
            } else if (ok2) {
              body.resume();
            }
            return ok2;
          });
        }
      });
    });
    body.on('end', () => {
      if (isAborted() || ended) return;
      // Zero-length body, or the api sent less than it announced.
      res.cork(() => (length === 0 ? res.end() : res.close()));
      end();
    });
  } else {
    body.on('data', (chunk: Buffer) => {
      if (isAborted() || ended) return;
      res.cork(() => {
        if (!res.write(chunk)) {
          body.pause();
          res.onWritable(() => {
            body.resume();
            return true;
          });
        }
      });
    });
    body.on('end', () => {
      if (isAborted() || ended) return;
      res.cork(() => res.end());
      end();
    });
  }
}
