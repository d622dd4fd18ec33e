/**
 * The discovery documents (`/llms.txt`, `/llms-full.txt`, `/skill`), generated from the
 * OpenAPI description so they can never disagree with it.
 */

interface Operation {
  operationId?: string;
  summary?: string;
  description?: string;
  tags?: string[];
  parameters?: { name: string; in: string; required?: boolean; description?: string }[];
  requestBody?: { required?: boolean; content?: Record<string, { schema?: JsonSchema }> };
  responses?: Record<string, { description?: string; content?: Record<string, { schema?: unknown }> }>;
  security?: unknown[];
}
interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  description?: string;
  enum?: unknown[];
  items?: JsonSchema;
  $ref?: string;
  anyOf?: JsonSchema[];
}
export interface OpenApiDoc {
  info: { title: string; description?: string; version: string };
  servers?: { url: string; description?: string }[];
  paths: Record<string, Record<string, Operation>>;
  components?: { schemas?: Record<string, JsonSchema> };
}

const METHODS = ['get', 'post', 'put', 'patch', 'delete'];

function operations(doc: OpenApiDoc) {
  const out: { method: string; path: string; op: Operation }[] = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (op) out.push({ method: method.toUpperCase(), path, op });
    }
  }
  return out;
}

function typeOf(s: JsonSchema | undefined): string {
  if (!s) return 'any';
  if (s.$ref) return s.$ref.split('/').at(-1) ?? 'object';
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(' | ');
  if (s.anyOf) return s.anyOf.map(typeOf).join(' | ');
  if (s.type === 'array') return `${typeOf(s.items)}[]`;
  return Array.isArray(s.type) ? s.type.join(' | ') : (s.type ?? 'object');
}

export function llmsTxt(doc: OpenApiDoc, baseUrl: string): string {
  const lines = [
    `# ${doc.info.title}`,
    '',
    `> ${doc.info.description ?? ''}`,
    '',
    `Base URL: ${baseUrl}. Full reference: ${baseUrl}/llms-full.txt. OpenAPI 3.1: ${baseUrl}/api/openapi.json.`,
    '',
    '## Endpoints',
    '',
  ];
  for (const { method, path, op } of operations(doc)) lines.push(`- ${method} ${path}: ${op.summary ?? ''}`);
  return `${lines.join('\n')}\n`;
}

export function llmsFullTxt(doc: OpenApiDoc, baseUrl: string): string {
  const lines = [
    `# ${doc.info.title} (full reference, version ${doc.info.version})`,
    '',
    doc.info.description ?? '',
    '',
  ];
  lines.push(`Base URL: ${baseUrl}`, '');
  for (const { method, path, op } of operations(doc)) {
    lines.push(`## ${method} ${path}`, '', op.summary ?? '');
    if (op.description) lines.push('', op.description);
    if (op.security && op.security.length === 0) lines.push('', 'Public: no authentication.');
    const params = op.parameters ?? [];
    if (params.length) {
      lines.push('', 'Parameters:');
      for (const p of params)
        lines.push(
          `- ${p.name} (${p.in}${p.required ? ', required' : ''})${p.description ? `: ${p.description}` : ''}`,
        );
    }
    const body = op.requestBody?.content?.['application/json']?.schema;
    if (body?.properties) {
      lines.push('', 'JSON body:');
      for (const [name, s] of Object.entries(body.properties)) {
        const req = body.required?.includes(name) ? ', required' : '';
        lines.push(`- ${name} (${typeOf(s)}${req})${s.description ? `: ${s.description}` : ''}`);
      }
    }
    const codes = Object.keys(op.responses ?? {});
    if (codes.length) lines.push('', `Responses: ${codes.join(', ')}`);
    lines.push('');
  }
  return `${lines.join('\n')}\n`;
}

export function skillMd(doc: OpenApiDoc, baseUrl: string): string {
  return `---
name: agent-sandbox-service
description: Use the ${doc.info.title} at ${baseUrl} to run AI coding agents on sandboxes, read their logs and manage the account. Use when asked to start, watch or manage agent conversations on this service.
---

# ${doc.info.title}

Authenticate every call with \`Authorization: Bearer $SVC_API_KEY\`. Get a key with
\`curl -X POST ${baseUrl}/api/auth/token -H 'content-type: application/json' -d '{"email":"...","password":"..."}'\`.

Errors are \`{error, message}\`; branch on \`error\`. Retry \`rate_limited\` after \`Retry-After\` seconds.

The whole reference is at ${baseUrl}/llms-full.txt and the OpenAPI 3.1 document at ${baseUrl}/api/openapi.json.

## Endpoints

${operations(doc)
  .map(({ method, path, op }) => `- \`${method} ${path}\`: ${op.summary ?? ''}`)
  .join('\n')}
`;
}
