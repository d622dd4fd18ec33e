import uWS, { type TemplatedApp } from 'uWebSockets.js';
import { ApiError, RUNNER_CONNECT_PATH } from '@svc/core';
import type { runners } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric, RunnerSession } from '../fabric/fabric.ts';
import type { AdmitFor } from '../ratelimit/admission.ts';
import { REQUEST_ID_HEADER, requestId } from '../request-id.ts';
import type { ClientOf } from './client-ip.ts';
import { writeError } from './respond.ts';

interface SocketData {
  runner: runners.RunnerRow;
  session?: RunnerSession;
  closed: boolean;
}

/** Frames larger than this close the connection (uWS answers with 1009). */
const MAX_FRAME_BYTES = 16 * 1024 * 1024;

/**
 * The production transport of the runner fabric: `wss://<base>/api/runners/connect` on the
 * edge. The token is checked at the upgrade (401 in the spec's error shape, before any
 * WebSocket), then every binary frame goes to the fabric's session. uWS pings idle sockets
 * itself; the fabric closes a runner that stops sending heartbeats.
 */
export function registerRunnerSocket(
  app: TemplatedApp,
  fabric: RunnerFabric,
  admitFor: AdmitFor,
  logger: Logger,
  clientOf: ClientOf,
): void {
  app.ws<SocketData>(RUNNER_CONNECT_PATH, {
    compression: uWS.DISABLED,
    maxPayloadLength: MAX_FRAME_BYTES,
    idleTimeout: 60,
    sendPingsAutomatically: true,
    upgrade: (res, req, context) => {
      const key = req.getHeader('sec-websocket-key');
      const protocol = req.getHeader('sec-websocket-protocol');
      const extensions = req.getHeader('sec-websocket-extensions');
      const authorization = req.getHeader('authorization');
      const ip = clientOf(res, req);
      const admit = admitFor(ip, req.getUrl());
      const reqId = requestId(req.getHeader(REQUEST_ID_HEADER));
      const startedAt = performance.now();
      const logged = (status: number) =>
        logger.info(
          { reqId, method: 'GET', route: RUNNER_CONNECT_PATH, status, ms: Math.round(performance.now() - startedAt) },
          'request',
        );
      const refuse = (e: ApiError) => {
        res.cork(() => writeError(res, e, false, reqId));
        logged(e.status);
      };
      let aborted = false;
      res.onAborted(() => {
        aborted = true;
      });
      void (async () => {
        const refused = await admit();
        if (aborted) return;
        if (refused) return refuse(refused);
        const runner = await fabric.authenticate(authorization);
        if (aborted) return;
        if (!runner) return refuse(new ApiError('unauthorized', 'The runner token was not accepted.'));
        res.cork(() => res.upgrade<SocketData>({ runner, closed: false }, key, protocol, extensions, context));
        logged(101);
      })().catch((err) => {
        logger.error({ err, reqId }, 'runner upgrade failed');
        if (!aborted) refuse(new ApiError('internal_error'));
      });
    },
    open: (ws) => {
      const data = ws.getUserData();
      data.session = fabric.attach(data.runner, {
        send: (frame) => {
          if (!data.closed) ws.send(frame, true);
        },
        close: (code, reason) => {
          if (data.closed) return;
          data.closed = true;
          ws.end(code, reason);
        },
      });
    },
    message: (ws, message, isBinary) => {
      const data = ws.getUserData();
      // The ArrayBuffer is only valid during this call: copy it for the fabric.
      if (isBinary) data.session?.message(new Uint8Array(message.slice(0)));
      else data.session?.message(new Uint8Array(0));
    },
    close: (ws) => {
      const data = ws.getUserData();
      data.closed = true;
      data.session?.closed();
    },
  });
}
