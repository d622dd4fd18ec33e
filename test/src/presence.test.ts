import { type PresenceSignals, presenceOf } from '@svc/core';
import t from 'tap';

const base: PresenceSignals = {
  sandbox: 'ready',
  runnerBacked: false,
  runnerOnline: false,
  runnerLastSeenAt: null,
  turnRunning: false,
  resumable: true,
};

t.test('a teammate’s presence: the first state whose condition holds', async (t) => {
  const seen = new Date('2026-11-25T14:02:41Z');
  const table: [string, Partial<PresenceSignals>, string, string | RegExp][] = [
    [
      'its sandbox failed, whatever else holds',
      { sandbox: 'failed', turnRunning: true, runnerBacked: true },
      'failed',
      /failed/,
    ],
    [
      'a runner-backed machine whose runner is away, even mid-turn',
      { runnerBacked: true, runnerOnline: false, runnerLastSeenAt: seen, turnRunning: true },
      'machine_offline',
      'Machine offline since 14:02',
    ],
    ['a runner never heard from', { runnerBacked: true, sandbox: 'suspended' }, 'machine_offline', 'Machine offline'],
    ['a runner-backed machine whose runner is online', { runnerBacked: true, runnerOnline: true }, 'online', 'Online'],
    [
      'a runner that is away matters not once the machine is gone',
      { runnerBacked: true, sandbox: 'terminated', resumable: false },
      'away',
      /fresh conversation/,
    ],
    ['its machine is being built or woken', { sandbox: 'provisioning', turnRunning: true }, 'starting', /Starting/],
    ['a turn runs', { turnRunning: true }, 'working', 'Working on a turn'],
    ['suspended', { sandbox: 'suspended' }, 'asleep', /Asleep/],
    ['ready', {}, 'online', 'Online'],
    ['ready, its conversation ended: the machine still answers', { resumable: false }, 'online', 'Online'],
    ['no machine and a conversation that cannot be resumed', { sandbox: null, resumable: false }, 'away', /Away/],
    ['a live conversation whose machine was destroyed', { sandbox: 'terminated' }, 'offline', /Offline/],
    ['no sandbox at all', { sandbox: null }, 'offline', /Offline/],
  ];
  for (const [when, signals, state, label] of table) {
    const p = presenceOf({ ...base, ...signals });
    t.equal(p.state, state, when);
    if (typeof label === 'string') t.equal(p.label, label, `${when}: label`);
    else t.match(p.label, label, `${when}: label`);
  }
});
