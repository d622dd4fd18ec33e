import type { FastifyReply } from 'fastify';

/** Escapes text for HTML element content and attribute values. */
export const esc = (s: string) =>
  s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c] as string);

/**
 * The few browser pages the service renders itself (OAuth consent, the targets of mailed
 * links): no script, no third-party asset, not frameable, never cached. `formTarget` is the
 * URL a form on the page may redirect to after posting (the OAuth client's redirect URI).
 */
export function page(reply: FastifyReply, status: number, title: string, body: string, formTarget?: string) {
  const formAction = formTarget ? `'self' ${new URL(formTarget).origin}` : "'self'";
  return reply
    .code(status)
    .header('content-type', 'text/html; charset=utf-8')
    .header('cache-control', 'no-store')
    .header('x-frame-options', 'DENY')
    .header(
      'content-security-policy',
      `default-src 'none'; style-src 'unsafe-inline'; form-action ${formAction}; frame-ancestors 'none'`,
    )
    .send(`<!doctype html><html><head><meta charset="utf-8"><title>${esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}
input{display:block;width:100%;margin:.3rem 0 1rem;padding:.5rem}button{padding:.5rem 1rem;margin-right:.5rem}</style>
</head><body><h1>${esc(title)}</h1>${body}</body></html>`);
}
