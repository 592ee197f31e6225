// Enqueue no-op jobs into a BullMQ queue and print one JSON line: the timed rate and the
// client CPU per job. Untimed warm-up jobs (data {i: -k}) go first, on the same connection.
//
//   node producer.mjs --home DIR --url URL --prefix P --queue Q --mode one|bulk
//                     --n N --batch B --warmup W
//
// one: ``await queue.add('noop', {i})`` in a loop, one round trip per job.
// bulk: ``queue.addBulk`` of B jobs per call (one pipeline of B script calls).
import { bullmq, connection, count, options } from './common.mjs';

const o = options({ mode: 'string', n: 'string', batch: 'string', warmup: 'string' });
const [n, batch, warmup] = [count(o.n, 'n'), count(o.batch, 'batch'), count(o.warmup, 'warmup')];
if (o.mode !== 'one' && o.mode !== 'bulk') throw new Error(`--mode must be one or bulk, not ${o.mode}`);
if (o.mode === 'bulk' && batch < 1) throw new Error('--batch must be >= 1');
const { Queue } = bullmq(o.home);
const queue = new Queue(o.queue, { connection: connection(o.url), prefix: o.prefix });
await queue.waitUntilReady();

async function one(from, to, sign) {
  for (let i = from; i < to; i++) await queue.add('noop', { i: sign * i });
}

async function bulk(from, to, sign) {
  for (let s = from; s < to; s += batch) {
    const jobs = [];
    for (let i = s; i < Math.min(to, s + batch); i++) jobs.push({ name: 'noop', data: { i: sign * i } });
    await queue.addBulk(jobs);
  }
}

const run = o.mode === 'one' ? one : bulk;
await run(0, o.mode === 'one' ? warmup : Math.min(warmup, batch), -1);
const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
await run(0, n, 1);
const wall = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
await queue.close();
console.log(JSON.stringify({ tasks: n, per_s: n / wall, cpu_us_per_task: (cpu.user + cpu.system) / n }));
