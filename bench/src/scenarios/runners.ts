import { join } from 'node:path';
import { startFleet } from '../clients/fleet.ts';
import { benchModule } from '../lib/child-module.ts';
import { repoRoot } from '../lib/machine.ts';
import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { rssOf, sleep, startProcess } from '../lib/proc.ts';
import { absoluteTarget, type Outcome, ratioTarget, type Scenario } from '../lib/scenario.ts';
import { Histogram, round } from '../lib/stats.ts';
import type { Series } from '../lib/svg.ts';
import type { BenchRunner } from '../ops/runners.ts';

/** Seconds the held sockets settle before memory is read (allocations, first heartbeats). */
const SETTLE_S = 3;

/**
 * N runners held by our service, each a real runner connection (hello, welcome, heartbeats at
 * the interval the welcome gives, an ack for every command), from load-client processes. The
 * gateway's memory per runner socket (RSS delta / N) and the round trip of a command: the
 * fabric sends `turn.interrupt` to a random runner, the runner acknowledges it, timed inside
 * the service from send to acknowledgement. Peer: a `ws` echo server in its own process with
 * the same N sockets from the same clients, its memory per socket and its echo round trip at
 * the same rate.
 */
export const runners: Scenario = {
  name: 'runners',
  title: 'runners: connected runners held, memory per runner socket and command round trip',
  defaults: { connections: 10_000, duration: 20, rate: 200 },
  smoke: { connections: 50, duration: 2, rate: 50 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const n = opts.connections;
    const rate = opts.rate || 200;
    const children = opts.smoke ? 1 : Math.max(2, Math.ceil(n / 4000));
    let clientCpu = 0;
    const figures: Record<string, unknown> = { runners: n, seconds: opts.duration, commandRate: rate, children };

    // --- ours: the service on a throwaway Postgres (its memory stays out of the gateway's RSS)
    progress.update('starting PostgreSQL');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const ours = await startOurs({ DATABASE_URL: pg.url });
    defer(() => ours.stop());
    const heartbeatMs = Number(
      (await ours.call<{ RUNNER_HEARTBEAT_MS: number }>('ops/runners#config')).RUNNER_HEARTBEAT_MS,
    );
    progress.update(`making ${n} runner tokens`);
    const made = await ours.call<{ runners: BenchRunner[] }>('ops/runners#makeRunners', { count: n });
    await sleep(1000);
    const oursBefore = rssOf(ours.pid);
    const connectStart = Date.now();
    const fleet = await startFleet(
      { kind: 'runner', url: ours.url, runners: made.runners },
      { children, concurrency: 50, onProgress: (open) => progress.update(`runners connected: ${open}/${n}`) },
    );
    defer(() => fleet.close());
    const connectSeconds = (Date.now() - connectStart) / 1000;
    const ids = made.runners.map((r) => r.id);
    const live = await ours.call<number>('ops/runners#liveCount', { ids });
    progress.say(`${fleet.open()} runners welcomed in ${connectSeconds.toFixed(1)} s; the fabric holds ${live}`);
    await sleep(SETTLE_S * 1000);
    const oursHeld = rssOf(ours.pid);
    progress.update(`command round trips, ${rate}/s for ${opts.duration}s`);
    const countdown = progress.countdown(opts.duration, () => `${fleet.open()} runners open`);
    const trips = await ours.call<{
      sent: number;
      failed: number;
      histogram: number[];
      perSecond: { second: number; count: number; p50: number; p99: number }[];
    }>('ops/runners#commandRoundTrips', { ids, rate, seconds: opts.duration });
    await countdown;
    const oursAfter = rssOf(ours.pid);
    const liveAfter = await ours.call<number>('ops/runners#liveCount', { ids });
    const oursStop = await fleet.stop();
    clientCpu += fleet.cpuSeconds();
    await fleet.close();
    await ours.stop();
    const oursTrips = new Histogram();
    oursTrips.merge(trips.histogram);
    // Memory held per runner: the steady state after the round-trip phase (heartbeats flowed).
    const oursPer = Math.max(oursAfter - oursBefore, 0) / n;
    figures.ours = {
      rssBefore: oursBefore,
      rssHeld: oursHeld,
      rssAfter: oursAfter,
      bytesPerRunnerAtSettle: round((oursHeld - oursBefore) / n),
      bytesPerRunner: round(oursPer),
      connectSeconds: round(connectSeconds),
      heldAtStart: live,
      heldAtEnd: liveAfter,
      heartbeatMs,
      commands: { sent: trips.sent, failed: trips.failed, ...oursTrips.summary() },
      closes: oursStop.closes,
      clientErrors: oursStop.errors,
      clientErrorSamples: oursStop.errorSamples,
      connectRetries: oursStop.retries,
    };
    progress.say(
      `ours: ${liveAfter} runners held, ${round(oursPer)} B per runner, command round trip p50 ${round(oursTrips.percentile(50), 3)} ms p99 ${round(oursTrips.percentile(99), 3)} ms (${trips.failed} failed)`,
    );

    // --- peer: a ws echo server with the same N sockets
    let echoPer = Number.NaN;
    let echoTrips = new Histogram();
    const echoSeries: [number, number][] = [];
    try {
      const echoModule = benchModule(join(repoRoot, 'bench/src/clients/ws-echo.ts'));
      const echo = await startProcess(process.execPath, [...echoModule.execArgv, echoModule.script], {
        ready: /listening (\d+)/,
        cwd: repoRoot,
        name: 'ws echo server',
      });
      defer(() => echo.stop());
      const pid = echo.child.pid as number;
      await sleep(1000);
      const echoBefore = rssOf(pid);
      const echoFleet = await startFleet(
        { kind: 'echo', url: `ws://127.0.0.1:${echo.ready[1]}/`, count: n },
        { children, concurrency: 50, onProgress: (open) => progress.update(`echo sockets open: ${open}/${n}`) },
      );
      defer(() => echoFleet.close());
      await sleep(SETTLE_S * 1000);
      const echoHeld = rssOf(pid);
      let second = 0;
      echoFleet.go(rate, (t) => {
        if (t.count) echoSeries.push([second, t.p99]);
        second++;
      });
      await progress.countdown(opts.duration, () => `echo: ${echoFleet.open()} sockets open`);
      const echoStop = await echoFleet.stop();
      const echoAfter = rssOf(pid);
      clientCpu += echoFleet.cpuSeconds();
      await echoFleet.close();
      await echo.stop();
      echoTrips = echoStop.histogram;
      echoPer = Math.max(echoAfter - echoBefore, 0) / n;
      figures.echo = {
        rssBefore: echoBefore,
        rssHeld: echoHeld,
        rssAfter: echoAfter,
        bytesPerSocketAtSettle: round((echoHeld - echoBefore) / n),
        bytesPerSocket: round(echoPer),
        open: echoStop.open,
        echoes: { sent: echoStop.frames, received: echoStop.acked, ...echoTrips.summary() },
        closes: echoStop.closes,
      };
      progress.say(
        `ws echo: ${echoStop.open} sockets, ${round(echoPer)} B per socket, echo round trip p50 ${round(echoTrips.percentile(50), 3)} ms p99 ${round(echoTrips.percentile(99), 3)} ms`,
      );
    } catch (err) {
      figures.echoError = (err as Error).message;
      progress.say(`the ws echo server could not be measured: ${(err as Error).message}`);
    }

    // Below RSS's resolution (a smoke run's few sockets) a delta can be 0: shown as 1 byte, noted.
    const floor = (x: number) => (Number.isFinite(x) && x > 0 ? x : 1);
    const memory = ratioTarget(
      'gateway memory per runner socket',
      'B',
      floor(oursPer),
      Number.isFinite(echoPer) ? { name: 'ws echo server', value: floor(echoPer) } : undefined,
      { atMost: 2 },
      !opts.smoke,
    );
    if (!(oursPer > 0) || !(echoPer > 0)) memory.note = 'an RSS delta was not positive (too few sockets to measure)';
    const held = absoluteTarget(
      'runners held by one gateway process',
      'runners',
      liveAfter,
      { atLeast: 10_000 },
      !opts.smoke,
    );
    if (n < 10_000) held.note = `only ${n} runners were asked for`;
    const oursSeries: Series = {
      name: 'ours: command to ack p99',
      points: trips.perSecond.filter((s) => s.count > 0).map((s) => [s.second, round(s.p99, 3)] as [number, number]),
    };
    const oursP50: Series = {
      name: 'ours: command to ack p50',
      points: trips.perSecond.filter((s) => s.count > 0).map((s) => [s.second, round(s.p50, 3)] as [number, number]),
    };
    return {
      figures,
      targets: [held, memory],
      charts: [
        {
          kind: 'bars',
          file: 'memory',
          title: `Memory per socket with ${n} sockets held (RSS delta / N)`,
          unit: 'bytes',
          bars: [
            { label: 'per socket', value: oursPer, who: 'ours (runner)' },
            { label: 'per socket', value: echoPer, who: 'ws echo server' },
          ],
        },
        {
          kind: 'bars',
          file: 'round-trip',
          title: `Round trip at ${rate}/s with ${n} sockets held`,
          unit: 'ms',
          bars: [
            { label: 'p50', value: oursTrips.percentile(50), who: 'ours (command to ack)' },
            { label: 'p50', value: echoTrips.percentile(50), who: 'ws echo' },
            { label: 'p99', value: oursTrips.percentile(99), who: 'ours (command to ack)' },
            { label: 'p99', value: echoTrips.percentile(99), who: 'ws echo' },
          ],
        },
        {
          kind: 'lines',
          file: 'round-trip-over-time',
          title: 'Round trip p99 each second',
          unit: 'ms',
          xLabel: 'second',
          series: [oursSeries, oursP50, { name: 'ws echo: message to echo p99', points: echoSeries }],
        },
      ],
      notes: [
        `${n} runners over ${children} load-client process(es) (the ws library, msgpack frames of core's runner protocol): each says hello, is welcomed, sends a heartbeat every ${heartbeatMs} ms (the service's default RUNNER_HEARTBEAT_MS; each heartbeat is a presence UPDATE in Postgres) and acknowledges every command.`,
        'The service runs on a throwaway PostgreSQL (not the embedded one, a child of the service) so the database is not inside the measured RSS. Memory per runner is (gateway RSS after the round-trip phase - RSS before any runner connected, after the runners were made) / N; the figure right after connecting is in the JSON too.',
        `Command round trip: the fabric sends turn.interrupt (the smallest command: the runner acknowledges it and, for a turn it does not run, does nothing more) to a random held runner, ${rate} a second for ${opts.duration} s, timed inside the service from the send to the ack (fabric.command resolving). The echo peer: the same clients send ${rate} 16-byte messages a second to random sockets and time each echo in the client.`,
        "The issue sets no bar for the round trip; it is reported beside the echo server's as the floor of a WebSocket round trip on this machine.",
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};
