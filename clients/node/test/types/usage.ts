// Compile-only: the declarations in index.d.ts, used as an application
// would. `npm run typecheck` (tsc --strict) fails if they do not fit
// together; nothing here runs.
import { bucket, Client, LoadReporter, NotFound, PoolFollower, Router, Worker, type Grant, type Handler } from '../../index.js';

async function usage(): Promise<void> {
  const client = new Client('http://127.0.0.1:7400', { token: 't', timeout: 10 });
  const ks = await client.createKeyspace({ name: 'rooms', buckets: 1024, leaseTtl: 10, drainTimeout: 30 });
  const buckets: number = ks.buckets;
  const { map } = await client.getMap('rooms', { sinceEpoch: 0, wait: 5 });
  const epoch: bigint = map.epoch;
  const b: number = bucket('!room:example.org', buckets);

  const st = await client.status();
  const healthy: boolean = st.store.healthy;
  const waiting: number = st.keyspaces[0].membersWithoutBuckets;
  const leader: string | undefined = st.replicas.find((r) => r.leader)?.id;
  const hist = await client.history('rooms', { limit: 20 });
  const reason: 'create' | 'join' | 'leave' | 'crash' | 'drain' | 'load' | 'update' | 'import' | 'unspecified' = hist[0].reason;
  const runs = (await client.buckets('rooms')).runs.filter((r) => r.state === 'releasing');

  const router = new Router(client, 'rooms');
  await router.start();
  router.on('change', (m) => console.log(m.epoch));

  const handler: Handler = {
    async acquire(g: Grant) { console.log(g.bucket, g.token); },
    async release(bucket: number) { console.log(bucket); },
  };
  const w = new Worker(client, 'rooms', { id: 'w1', address: '10.0.0.1:80' }, handler);
  const session: string = await w.start();
  w.on('acquired', (g) => console.log(g.bucket));
  await w.close({ timeout: 30 });

  const f = new PoolFollower(client, 'gateways');
  const lr = new LoadReporter(client, 'gateways', 'frontend-1', { interval: 5 });
  lr.add('acme', 3);
  await client.reportLoad('gateways', 'r', 1n, [{ tenant: 'acme', count: 3 }], { period: 0.5 });
  try {
    await client.getKeyspace('nope');
  } catch (e) {
    if (e instanceof NotFound) console.log(e.code);
  }
  console.log(epoch, b, healthy, waiting, leader, reason, runs, session, f);
}
void usage;
