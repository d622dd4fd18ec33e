// Preloaded into every process of our service by the bench (NODE_OPTIONS=--import=<this>), edge
// processes included, when node runs with --expose-gc: SIGUSR2 runs a full collection, twice
// 50 ms apart, so a memory reading afterwards counts what is held rather than garbage not yet
// collected. The bench reaches the edge processes this way because they are not its children
// and answer no bench calls; the service itself knows nothing of it. Plain JavaScript: it
// loads before tsx.
// Without --expose-gc the handler does nothing, but it is there: a signal must never end a process.
const gc = typeof globalThis.gc === 'function' ? globalThis.gc : () => {};
process.on('SIGUSR2', () => {
  gc();
  setTimeout(gc, 50).unref();
});
