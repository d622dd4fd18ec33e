import type { Test } from 'tap';
import type { Invalidations } from './invalidation.ts';

/**
 * What every Invalidations adapter must do (CONVENTIONS 1). `node` builds one more node on the
 * same store each time it is called; nodes of one call share nothing with another call's.
 */
export function invalidationsContract(t: Test, store: () => Promise<() => Promise<Invalidations>>) {
  const heard = (n: Invalidations) => {
    const ids: string[] = [];
    let resets = 0;
    const listening = n.listen(
      (id) => ids.push(id),
      () => resets++,
    );
    return { ids, resets: () => resets, listening };
  };
  const until = async (check: () => boolean) => {
    for (let i = 0; i < 200 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  };

  t.test('an account published by one node reaches every other node, and not the sender', async (t) => {
    const node = await store();
    const [a, b, c] = [await node(), await node(), await node()];
    t.teardown(() => Promise.all([a.close(), b.close(), c.close()]));
    const [ha, hb, hc] = [heard(a), heard(b), heard(c)];
    await Promise.all([ha.listening, hb.listening, hc.listening]);
    await a.publish('acc_one');
    await b.publish('acc_two');
    await until(() => hc.ids.length === 2 && ha.ids.length === 1 && hb.ids.length === 1);
    t.same(hc.ids, ['acc_one', 'acc_two'], 'a third node hears both, in order');
    t.same(ha.ids, ['acc_two'], 'a node does not hear its own');
    t.same(hb.ids, ['acc_one']);
  });

  t.test('a closed node hears nothing more', async (t) => {
    const node = await store();
    const [a, b] = [await node(), await node()];
    t.teardown(() => a.close());
    const hb = heard(b);
    await hb.listening;
    await b.close();
    await a.publish('acc_after_close');
    await new Promise((r) => setTimeout(r, 100));
    t.same(hb.ids, []);
  });
}
