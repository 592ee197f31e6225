// One BullMQ worker, concurrency 1, that drains --n no-op jobs (the processor returns the
// job's data, stored as its return value) and exits: 0 when all completed, 1 when any failed.
//
//   node worker.mjs --home DIR --url URL --prefix P --queue Q --n N
import { bullmq, connection, count, options } from './common.mjs';

const o = options({ n: 'string' });
const n = count(o.n, 'n');
const { Worker } = bullmq(o.home);
const worker = new Worker(o.queue, async (job) => job.data,
  { connection: connection(o.url), prefix: o.prefix, concurrency: 1, autorun: false });
let completed = 0;
let failed = 0;
const done = new Promise((resolve) => {
  const check = () => { if (completed + failed >= n) resolve(); };
  worker.on('completed', () => { completed++; check(); });
  worker.on('failed', (job, err) => { failed++; console.error(`job ${job?.id} failed: ${err}`); check(); });
  if (n === 0) resolve();
});
worker.on('error', (err) => console.error(`worker error: ${err}`));
const running = worker.run();
await done;
await worker.close();
await running;
console.log(JSON.stringify({ completed, failed }));
process.exit(failed ? 1 : 0);
