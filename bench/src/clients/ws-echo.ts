/**
 * The runners scenario's peer: a `ws` echo server in a process of its own, the plainest
 * Node WebSocket server that holds sockets and answers each message with itself. Prints
 * `listening <port>` when ready.
 */
import { WebSocketServer } from 'ws';

const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, perMessageDeflate: false, maxPayload: 1024 * 1024 });
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  ws.on('error', () => {});
});
wss.on('listening', () => {
  const addr = wss.address();
  process.stdout.write(`listening ${typeof addr === 'object' && addr ? addr.port : 0}\n`);
});
process.on('SIGTERM', () => {
  for (const c of wss.clients) c.terminate();
  wss.close(() => process.exit(0));
});
