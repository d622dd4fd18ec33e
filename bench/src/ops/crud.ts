/**
 * Inside the target (bench/src/serve.ts): two bench-only twins of the service's agent routes,
 * to measure what authentication costs on `GET /api/agents`. Each is a Fastify instance in the
 * target's process serving the service's own route module (gateway/src/api/routes/agents.ts:
 * the same handler, schemas, validation and serialization) on the service's own database pool.
 * `auth` registers the service's own authentication hook (registerAuth, through the service's
 * own credential cache, as the service authenticates); `open` sets, before each request, the principal that
 * the same key authenticates to, looked up once. The two differ only in that lookup. Neither
 * has the service's other hooks (request id, metrics, CORS, rate limit), so their difference
 * is authentication's alone. Listening on loopback, closed with `closeTwins`.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import { serializerCompiler, validatorCompiler } from 'fastify-type-provider-zod';
import { registerAuth } from '../../../gateway/src/api/auth.ts';
import type { ApiDeps } from '../../../gateway/src/api/deps.ts';
import { agentRoutes } from '../../../gateway/src/api/routes/agents.ts';
import type { Service } from '../../../gateway/src/main.ts';
import { authenticateBearer } from '../../../gateway/src/services/credentials.ts';

let twins: FastifyInstance[] = [];

async function twin(
  svc: Service,
  setUp: (app: FastifyInstance) => void,
): Promise<{ app: FastifyInstance; port: number }> {
  const app = Fastify({ logger: false });
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  setUp(app);
  // The route module reads only these of the api role's dependencies.
  await agentRoutes(app, { sql: svc.db.sql, launch: svc.launch } as unknown as ApiDeps);
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  twins.push(app);
  return { app, port: typeof address === 'object' && address ? address.port : 0 };
}

/** Starts both twins; `key` is the bearer key the load sends (and whose principal `open` uses). */
export async function startTwins(svc: Service, args: { key: string }): Promise<{ auth: number; open: number }> {
  const auth = { sql: svc.db.sql, credentialCache: svc.credentialCache };
  const principal = await authenticateBearer(auth, args.key, '127.0.0.1');
  if (!principal) throw new Error('the bench key does not authenticate');
  const withAuth = await twin(svc, (app) =>
    registerAuth(app, { ...auth, ownOrigin: () => svc.url, clientIpOf: (r) => r.ip }),
  );
  const open = await twin(svc, (app) => {
    app.decorateRequest('principal', null);
    app.decorateRequest('clientIp', null);
    app.addHook('onRequest', async (request) => {
      request.clientIp = request.ip;
      request.principal = { ...principal, ip: request.ip };
    });
  });
  return { auth: withAuth.port, open: open.port };
}

export async function closeTwins(_svc: Service): Promise<void> {
  const all = twins;
  twins = [];
  await Promise.all(all.map((app) => app.close()));
}
