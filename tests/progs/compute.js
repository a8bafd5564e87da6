// compute.js: a deterministic Node.js computation in steps, for checkpoint/restart tests.
//
// Checks that a running Node.js (V8 with its compiler and collector threads, libuv's event loop
// and thread pool, a worker thread with an isolate of its own) survives checkpoint/restart: each
// step asks the worker for a number over a message port, extends a SHA-256 chain with it, runs
// PBKDF2 in the thread pool, records the chain in a Map, then waits for a 10 ms timer. Prints
// START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if the Map holds what the
// loop recorded.
//
// Usage: node compute.js [SECONDS=5]
const crypto = require('crypto');
const { Worker } = require('worker_threads');
console.log('START');
const secs = parseFloat(process.argv[2] || '5');
const steps = Math.max(1, Math.floor(secs * 100));
const worker = new Worker(`
  const { parentPort } = require('worker_threads');
  parentPort.on('message', (n) => { let h = n; for (let i = 0; i < 20000; i++) h = (h * 31 + i) % 1000000007; parentPort.postMessage(h); });
`, { eval: true });
function ask(n) { return new Promise((res) => { worker.once('message', res); worker.postMessage(n); }); }
function pbkdf(data) { return new Promise((res, rej) => crypto.pbkdf2(data, 'salt', 10, 32, 'sha256', (e, k) => e ? rej(e) : res(k))); }
(async () => {
  let chain = crypto.createHash('sha256').update('ckpt').digest();
  const seen = new Map();
  for (let s = 0; s < steps; s++) {
    const h = await ask(s);
    chain = crypto.createHash('sha256').update(chain).update(String(h)).digest();
    chain = await pbkdf(chain);
    seen.set(s % 97, chain.toString('hex'));
    await new Promise((r) => setTimeout(r, 10));
  }
  await worker.terminate();
  const ok = seen.size === Math.min(97, steps) && seen.get((steps - 1) % 97) === chain.toString('hex');
  console.log('RESULT ' + crypto.createHash('sha256').update(chain).update(JSON.stringify([...seen])).digest('hex').slice(0, 16));
  console.log(ok ? 'PASS' : 'FAIL map');
})();
