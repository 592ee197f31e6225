// Shared by producer.mjs and worker.mjs: options, BullMQ from the benchmark's cache folder,
// the connection of a redis:// URL. Driven by scripts/bench/bullmq_side.py.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

const COMMON = { home: 'string', url: 'string', prefix: 'string', queue: 'string' };

// --name value options, all required: the common four plus ``extra`` ({name: 'string'}).
export function options(extra) {
  const spec = { ...COMMON, ...extra };
  const { values } = parseArgs({
    options: Object.fromEntries(Object.keys(spec).map((k) => [k, { type: 'string' }])),
    strict: true,
  });
  for (const k of Object.keys(spec)) {
    if (values[k] === undefined) throw new Error(`--${k} is required`);
  }
  return values;
}

// The bullmq package installed under ``home`` (its node_modules/), not a global one.
export function bullmq(home) {
  return createRequire(join(home, 'package.json'))('bullmq');
}

export function connection(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port), db: Number(u.pathname.slice(1) || 0) };
}

export function count(text, name) {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 0) throw new Error(`--${name} must be an integer >= 0, not ${text}`);
  return n;
}
