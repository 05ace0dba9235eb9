// Prepare a sandbox once, fork it into N copies, try a different strategy
// in each, keep the best. Every fork starts from the same files and the
// same Python variables; what each does stays its own.
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=... node fork-strategies.mjs
import { Sandbox } from '@e2b/code-interpreter'

const base = await Sandbox.create()
await base.runCode(`
import random
random.seed(7)
data = [random.randint(0, 10_000) for _ in range(20_000)]
`)

const strategies = {
  builtin: 'sorted(data)',
  insertion_on_sample: 'sorted(data[:2000])',
  bucket: '[x for b in [sorted(x for x in data if k*1000 <= x < (k+1)*1000) for k in range(11)] for x in b]',
}
const names = Object.keys(strategies)
const forks = await base.fork({ count: names.length })

const results = await Promise.all(forks.map(async (f, i) => {
  if (f instanceof Error) throw f
  const code = `import time\nt0 = time.perf_counter()\nout = ${strategies[names[i]]}\n(len(out), out == sorted(data), round(time.perf_counter() - t0, 4))`
  const r = await f.runCode(code)
  return { strategy: names[i], sandbox: f.sandboxId, result: r.text }
}))
console.table(results)

const correct = results.filter((r) => r.result.includes('20000, True'))
if (correct.length < 2) throw new Error('expected at least two correct strategies')
// The source was not touched by any fork.
if ((await base.runCode("'out' in globals()")).text !== 'False') throw new Error('a fork leaked into the source')
for (const f of forks) await f.kill()
await base.kill()
console.log('ok')
