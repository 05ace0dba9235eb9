// Keep-alive through the proxy with the stock SDK (driven by
// keepalive_test.go): many exchanges in a row and concurrently on the
// SDK's reused connections: unary calls, server streams with output,
// uploads and downloads small and large, with idle gaps around undici's
// keep-alive timeout (4 s). Counts failures instead of stopping at the
// first, and prints "keepalive: N ok, M failed" at the end.
// Env: KEEPALIVE_ROUNDS (default 40), KEEPALIVE_WORKERS (4),
// KEEPALIVE_SEED (random gaps; printed), KEEPALIVE_GAPS=0 (no idle gaps).
// Needs E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
const pkg = process.env.SDK_PACKAGE || 'e2b'
const { Sandbox } = await import(pkg)

const rounds = Number(process.env.KEEPALIVE_ROUNDS || 40)
const workers = Number(process.env.KEEPALIVE_WORKERS || 4)
const gaps = process.env.KEEPALIVE_GAPS !== '0'
let seed = Number(process.env.KEEPALIVE_SEED || Date.now() % 1000000)
console.log(`keepalive: seed ${seed} (KEEPALIVE_SEED), ${rounds} rounds x ${workers} workers, gaps ${gaps}`)
// mulberry32: a seeded generator, so a failing run's gaps can be replayed.
function rand() {
  seed |= 0; seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const sleep = (ms) => new Promise((res) => setTimeout(res, ms))

const big = new Uint8Array(320 << 10).map((_, i) => (i * 13) % 251)
let okN = 0
const failures = []

async function check(what, fn) {
  try {
    await fn()
    okN++
  } catch (e) {
    const cause = e && e.cause ? ` (cause: ${e.cause.code || ''} ${e.cause.message || e.cause})` : ''
    failures.push(`${what}: ${e && e.message}${cause}`)
    console.log(`FAIL ${what}: ${e && e.message}${cause}`)
  }
}

const eq = (got, want, what) => {
  if (got !== want) throw new Error(`${what}: got ${JSON.stringify(got).slice(0, 80)}, want ${JSON.stringify(want).slice(0, 80)}`)
}

let sbx
try {
  sbx = await Sandbox.create()
  const ops = [
    ['run true', async (w) => eq((await sbx.commands.run('true')).exitCode, 0, 'exit')],
    ['run echo', async (w) => eq((await sbx.commands.run(`echo ${w}`)).stdout, `${w}\n`, 'stdout')],
    ['run env', async (w) => eq((await sbx.commands.run('echo $K', { envs: { K: 'v' } })).stdout, 'v\n', 'stdout')],
    ['stream', async (w) => {
      const r = await sbx.commands.run('for i in $(seq 1 300); do echo line $i; done')
      eq(r.stdout.split('\n').length, 301, 'lines')
    }],
    ['write small', async (w) => sbx.files.write(`/tmp/s${w}.txt`, `small ${w}`)],
    ['read small', async (w) => {
      await sbx.files.write(`/tmp/r${w}.txt`, `read ${w}`)
      eq(await sbx.files.read(`/tmp/r${w}.txt`), `read ${w}`, 'content')
    }],
    ['write big', async (w) => sbx.files.write(`/tmp/b${w}.bin`, big.buffer)],
    ['read big', async (w) => {
      await sbx.files.write(`/tmp/rb${w}.bin`, big.buffer)
      const back = await sbx.files.read(`/tmp/rb${w}.bin`, { format: 'bytes' })
      eq(Buffer.compare(Buffer.from(back), Buffer.from(big)), 0, 'bytes')
    }],
    ['missing', async (w) => {
      try { await sbx.files.read('/tmp/nope'); throw new Error('read of a missing file passed') } catch (e) {
        if (!/not found|no such|does not exist/i.test(e.message)) throw e
      }
    }],
    ['exit 3', async (w) => {
      try { await sbx.commands.run('exit 3'); throw new Error('exit 3 passed') } catch (e) {
        if (e.exitCode !== 3) throw e
      }
    }],
  ]
  // Gaps just under, at and over undici's 4 s keep-alive timeout, and a
  // short one; chosen per round with the seeded generator, shared by all
  // workers so they go idle together.
  const gapFor = []
  for (let r = 0; r < rounds; r++) gapFor.push(gaps && r % 8 === 7 ? [3900, 4000, 4100, 5000, 300][Math.floor(rand() * 5)] : 0)
  const order = []
  for (let r = 0; r < rounds * workers; r++) order.push(Math.floor(rand() * ops.length))
  await Promise.all(Array.from({ length: workers }, async (_, w) => {
    for (let r = 0; r < rounds; r++) {
      for (let k = 0; k < ops.length; k++) {
        const [name, fn] = ops[(order[r * workers + w] + k) % ops.length]
        await check(`worker ${w} round ${r} ${name}`, () => fn(w))
      }
      if (gapFor[r]) await sleep(gapFor[r])
    }
  }))
} finally {
  if (sbx) await sbx.kill().catch((e) => console.log(`kill: ${e.message}`))
}
console.log(`keepalive: ${okN} ok, ${failures.length} failed`)
process.exit(failures.length ? 1 : 0)
