/**
 * A fake model API served over HTTPS, the way a real provider is: a TLS server on `address`
 * (an ephemeral port) that terminates TLS with `key`/`cert` and hands each connection's bytes
 * to the fake's plain HTTP port, so the fake speaks its wire format unchanged and records
 * every request as before. `url` names `host` (the name the certificate carries), not the
 * address. `close()` drops open connections.
 */
import { type AddressInfo, connect, type Socket } from 'node:net';
import { createServer } from 'node:tls';

export async function servedOverTls(
  fake: { url: string },
  o: { host: string; address: string; key: string; cert: string },
): Promise<{ url: string; close(): Promise<void> }> {
  const inner = new URL(fake.url);
  const sockets = new Set<Socket>();
  const server = createServer({ key: o.key, cert: o.cert }, (tls) => {
    const plain = connect(Number(inner.port), inner.hostname);
    for (const s of [tls, plain]) {
      sockets.add(s);
      s.once('close', () => sockets.delete(s));
    }
    tls.on('error', () => plain.destroy());
    plain.on('error', () => tls.destroy());
    tls.pipe(plain).pipe(tls);
  });
  await new Promise<void>((resolve) => server.listen(0, o.address, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `https://${o.host}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
