// Latency of the stock SDK's calls through two Spore servers in one run,
// interleaved call by call (A then B, then B then A) so that drift in the
// machine's load hits both alike: commands.run('true'), a 4 KiB
// files.write and files.read, a 1 MiB files.write. Prints p50/p90 per
// server. Used to measure keep-alive against one exchange per connection
// (keepalive_bench_test.go; docs/reliability.md, "Keep-alive through the proxy").
// Env: KA_A_URL, KA_B_URL (http://host:port), KA_A_NAME, KA_B_NAME,
// KA_CALLS (default 200), E2B_API_KEY.
const { Sandbox } = await import(process.env.SDK_PACKAGE || 'e2b')

const n = Number(process.env.KA_CALLS || 200)
const servers = [
  { name: process.env.KA_A_NAME || 'A', url: process.env.KA_A_URL },
  { name: process.env.KA_B_NAME || 'B', url: process.env.KA_B_URL },
]
const small = 'x'.repeat(4096)
const big = new Uint8Array(1 << 20).map((_, i) => i % 251)
const ops = {
  'commands.run(true)': (s) => s.commands.run('true'),
  'files.write 4 KiB': (s) => s.files.write('/tmp/small', small),
  'files.read 4 KiB': (s) => s.files.read('/tmp/small'),
  'files.write 1 MiB': (s) => s.files.write('/tmp/big', big.buffer),
}

const q = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))] }
try {
  for (const sv of servers) {
    sv.sbx = await Sandbox.create({ apiUrl: sv.url, sandboxUrl: sv.url })
    sv.times = {}
    for (const op of Object.keys(ops)) {
      sv.times[op] = []
      for (let i = 0; i < 10; i++) await ops[op](sv.sbx) // warm up
    }
  }
  for (const op of Object.keys(ops)) {
    for (let i = 0; i < n; i++) {
      for (const sv of i % 2 ? [...servers].reverse() : servers) {
        const t0 = performance.now()
        await ops[op](sv.sbx)
        sv.times[op].push(performance.now() - t0)
      }
    }
  }
  for (const op of Object.keys(ops)) {
    for (const sv of servers) {
      const t = sv.times[op]
      console.log(`${op.padEnd(20)} ${sv.name.padEnd(24)} p50 ${q(t, 0.5).toFixed(2)} ms  p90 ${q(t, 0.9).toFixed(2)} ms  (n=${t.length})`)
    }
  }
} finally {
  for (const sv of servers) if (sv.sbx) await sv.sbx.kill().catch((e) => console.log(`kill: ${e.message}`))
}
