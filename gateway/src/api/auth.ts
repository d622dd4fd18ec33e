import { ApiError } from '@svc/core';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type AuthDeps, authenticateBearer, authenticateSession } from '../services/credentials.ts';
import type { Principal } from '../services/principal.ts';

/**
 * Who may call a route, declared in its `config.auth`:
 * - `public`: anyone;
 * - `user`: a browser session or a bearer key of any scope;
 * - `full`: a session or a full-scope key (SPEC Authentication 5);
 * - `admin`: `full`, and the account's role is admin.
 * Sandbox tokens (actor `sprite`) reach only routes that set `config.sprite: true`.
 */
export type AuthLevel = 'public' | 'user' | 'full' | 'admin';

declare module 'fastify' {
  interface FastifyContextConfig {
    auth?: AuthLevel;
    sprite?: boolean;
  }
  interface FastifyRequest {
    principal: Principal | null;
    clientIp: string | null;
  }
}

export const SESSION_COOKIE = 'svc_session';
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

export function requirePrincipal(request: FastifyRequest): Principal {
  if (!request.principal) throw new ApiError('unauthorized');
  return request.principal;
}

/**
 * Authenticates every routed request before its handler. A bearer key wins over a cookie.
 * Cookie-authenticated writes must come from our own origin: a browser on another origin
 * never carries the session (SameSite=Lax), and a same-site page on another origin is refused
 * by the Origin check, so only a bearer key crosses an origin.
 */
export function registerAuth(
  app: FastifyInstance,
  deps: AuthDeps & { ownOrigin: () => string; clientIpOf: (r: FastifyRequest) => string | null },
): void {
  app.decorateRequest('principal', null);
  app.decorateRequest('clientIp', null);
  app.addHook('onRequest', async (request) => {
    request.clientIp = deps.clientIpOf(request);
    const level = request.routeOptions.config?.auth;
    if (level === undefined || level === 'public') return;
    const header = request.headers.authorization;
    let principal: Principal | undefined;
    if (header !== undefined) {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
      if (m?.[1]) principal = await authenticateBearer(deps, m[1], request.clientIp);
    } else {
      const cookie = request.cookies?.[SESSION_COOKIE];
      if (cookie) {
        principal = await authenticateSession(deps, cookie, request.clientIp);
        const origin = request.headers.origin;
        if (principal && !SAFE_METHODS.has(request.method) && origin !== undefined && origin !== deps.ownOrigin()) {
          throw new ApiError('forbidden', 'A browser session may not be used from another origin; use a bearer key.');
        }
      }
    }
    if (!principal) throw new ApiError('unauthorized');
    if (principal.actor === 'sprite' && !request.routeOptions.config?.sprite) {
      throw new ApiError('forbidden', 'A sandbox token may not use this route.');
    }
    if ((level === 'full' || level === 'admin') && principal.scope !== 'full') {
      throw new ApiError('forbidden', 'This route needs a full-scope key.');
    }
    if (level === 'admin' && principal.role !== 'admin') throw new ApiError('forbidden', 'This route is for admins.');
    request.principal = principal;
  });
}
