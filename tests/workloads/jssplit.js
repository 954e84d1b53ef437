// Node.js workload for JIT frames named from V8's perf map: the main thread calls alphaWork,
// betaWork and gammaWork in turn, about 60/30/10 of its time, and measures each call by its own
// clock (process.hrtime: Node 20 has no per-thread CPU clock; only the main thread's samples
// are compared). Run with --perf-basic-prof --interpreted-frames-native-stack --no-turbo-inlining.
//
//     node jssplit.js SECONDS
//
// Prints TRUTH pid, alpha_ns, beta_ns, gamma_ns.
"use strict";

function alphaWork(n) {
  let total = 0;
  for (let i = 0; i < n; i++) {
    total += (i * i) % 7;
  }
  return total;
}

function betaWork(n) {
  let total = 0;
  for (let i = 0; i < n; i++) {
    total += Math.sqrt(i) | 0;
  }
  return total;
}

function gammaWork(n) {
  let total = 0;
  for (let i = 0; i < n; i++) {
    total ^= (i << 3) + (i >> 2);
  }
  return total;
}

function main() {
  const seconds = Number(process.argv[2]);
  const end = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  let alpha = 0n, beta = 0n, gamma = 0n, sink = 0;
  while (process.hrtime.bigint() < end) {
    const t0 = process.hrtime.bigint();
    sink += alphaWork(260000);
    const t1 = process.hrtime.bigint();
    sink += betaWork(800000);
    const t2 = process.hrtime.bigint();
    sink += gammaWork(700000);
    const t3 = process.hrtime.bigint();
    alpha += t1 - t0;
    beta += t2 - t1;
    gamma += t3 - t2;
  }
  console.log(
    `TRUTH pid=${process.pid} alpha_ns=${alpha} beta_ns=${beta} gamma_ns=${gamma} sink=${sink % 2}`
  );
}

main();
