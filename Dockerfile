# syntax=docker/dockerfile:1
# The svc image: every role in one process (`npm start`'s program), run by `node` as an
# unprivileged user. The service runs from gateway/dist/start.mjs, bundled when the image is
# made (gateway/bundle.mjs, with tsx's esbuild); the build stage installs production dependencies.

FROM node:20-bookworm-slim AS deps
WORKDIR /app
# Every workspace's manifest, so `npm ci` can check the lockfile; sources come later, so this
# layer is rebuilt only when dependencies change.
COPY package.json package-lock.json ./
COPY core/package.json core/
COPY db/package.json db/
COPY gateway/package.json gateway/
COPY runner-agent/package.json runner-agent/
COPY bench/package.json bench/
COPY test/package.json test/
# The root's postinstall applies these to installed dependencies (patch-package).
COPY patches patches
# Only what the service runs: the gateway and runner-agent workspaces (and core, db) without dev
# tools, and the root's own dependency, patch-package, for that postinstall. The gateway's
# dependencies hold the agent CLIs the service ships (claude-agent-acp, codex-acp, gemini,
# opencode), which local runner-agents find in node_modules/.bin.
RUN npm ci --omit=dev --workspace gateway --workspace runner-agent --include-workspace-root --no-audit --no-fund && npm cache clean --force

FROM node:20-bookworm-slim
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=8080 \
    DATA_DIR=/data
WORKDIR /app
# What the `local` sandbox provider runs here besides node: git, which clones environments'
# repositories (ca-certificates for https, and the system bundle a brokered sandbox's CA joins),
# and isolation: each sandbox in namespaces of its own (bubblewrap; socat bridges it out of its
# network namespace). Docker's defaults refuse the user namespaces they need and the fresh
# /proc each sandbox mounts: run the container with `--security-opt seccomp=unconfined
# --security-opt systempaths=unconfined` (and apparmor=unconfined on an AppArmor host), as
# docker-compose.yml does, or set SANDBOX_ISOLATION=none for a single trusted tenant.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends bubblewrap ca-certificates git socat \
 && rm -rf /var/lib/apt/lists/*
# All that `npm ci` made, with the manifests: the root's node_modules and the workspaces' own
# (gateway/node_modules holds the undici 7 the gateway pins; the root's is a development one).
COPY --from=deps /app ./
COPY core core
COPY db db
COPY gateway gateway
# The `local` sandbox provider starts runner-agent processes from this copy.
COPY runner-agent runner-agent
RUN node -e "import('./gateway/bundle.mjs').then(async (m) => { if (!(await m.ensureBundle())) process.exit(1); })" \
 && node -e "import('./runner-agent/bundle.mjs').then((m) => m.ensureBundle())"
# The embedded database, generated master key and local sandboxes live under DATA_DIR.
RUN mkdir -p /data && chown node:node /data
VOLUME /data
USER node
EXPOSE 8080
# Liveness: the process answers. (Readiness, /api/ready, is for orchestrators that route traffic.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||8080)+'/api/health').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
ENTRYPOINT ["node", "gateway/start.mjs"]
