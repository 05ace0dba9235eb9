// Stock-SDK stdin checks (driven by sdk_test.go TestStdinThroughCat):
// 8 MiB through `cat` in 1 MiB sendStdin calls comes back complete and in
// order, and kill answers while a sendStdin is blocked on a process that
// never reads. Needs E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY; exits
// non-zero on the first failed check; prints one line per step.
import assert from 'node:assert/strict'

const pkg = process.env.SDK_PACKAGE || 'e2b'
const { Sandbox, CommandExitError } = await import(pkg)

const MiB = 1 << 20
let step = 0
const t0 = Date.now()
const ok = (what) => console.log(`ok ${++step} - ${pkg}: ${what} (${Date.now() - t0} ms)`)

// Numbered 8-byte lines ("0000000\n"...): a lost, repeated or reordered
// chunk shows as a mismatch.
function pattern(n) {
  let s = ''
  for (let i = 0; s.length < n; i++) s += String(i).padStart(7, '0') + '\n'
  return s.slice(0, n)
}

// until polls cond (generous deadline: it must happen at all, not fast).
async function until(cond, what, ms = 60000) {
  for (const end = Date.now() + ms; Date.now() < end;) {
    if (await cond()) return
    await new Promise((res) => setTimeout(res, 50))
  }
  throw new Error(`timed out waiting for ${what}`)
}

// A promise that settles with its outcome instead of throwing.
const settle = (p) => p.then((v) => ({ ok: true, v }), (e) => ({ ok: false, e }))

let sbx
try {
  sbx = await Sandbox.create()

  const want = pattern(8 * MiB)
  let got = ''
  const cat = await sbx.commands.run('cat', { background: true, stdin: true, timeoutMs: 0, onStdout: (d) => { got += d } })
  for (let off = 0; off < want.length; off += MiB) await sbx.commands.sendStdin(cat.pid, want.slice(off, off + MiB))
  await until(() => got.length >= want.length, `8 MiB of echo (have ${got.length} bytes)`)
  if (got !== want) {
    let i = 0
    while (i < got.length && got[i] === want[i]) i++
    assert.fail(`echo differs at byte ${i} of ${want.length} (got ${got.length} bytes)`)
  }
  assert.equal(await cat.kill(), true)
  await assert.rejects(cat.wait(), (e) => e instanceof CommandExitError)
  ok('8 MiB through cat in 1 MiB sendStdin calls: complete and in order; kill ends it')

  // A process that never reads its stdin (it only reports, every 50 ms,
  // how full the pipe is): a big sendStdin blocks once the pipe is full;
  // kill must still answer, and the write then fails.
  const sleeper = await sbx.commands.run(`python3 -c "import fcntl, struct, termios, time
while True:
    n = struct.unpack('i', fcntl.ioctl(0, termios.FIONREAD, b'0000'))[0]
    open('/tmp/stdin-fill.tmp', 'w').write('%d %d' % (n, fcntl.fcntl(0, 1032)))
    __import__('os').rename('/tmp/stdin-fill.tmp', '/tmp/stdin-fill')
    time.sleep(0.05)"`, { background: true, stdin: true, timeoutMs: 0 })
  const write = settle(sbx.commands.sendStdin(sleeper.pid, pattern(8 * MiB), { requestTimeoutMs: 120000 }))
  const full = async () => {
    const fill = await sbx.files.read('/tmp/stdin-fill').catch(() => '0 1')
    const [n, size] = fill.split(' ').map(Number)
    return n >= size
  }
  await until(full, 'the stdin pipe to fill')
  const k0 = Date.now()
  const killed = await settle(sbx.commands.kill(sleeper.pid, { requestTimeoutMs: 10000 }))
  if (!(killed.ok && killed.v === true)) {
    // Say what still answers, so a failure tells where it hung: the
    // process service at all (list), and a second kill.
    const took = Date.now() - k0
    const l0 = Date.now()
    const list = await settle(sbx.commands.list({ requestTimeoutMs: 10000 }))
    const lt = Date.now() - l0
    const again = await settle(sbx.commands.kill(sleeper.pid, { requestTimeoutMs: 10000 }))
    const w = await Promise.race([write, new Promise((res) => setTimeout(() => res('pending'), 100))])
    assert.fail(`kill during a blocked sendStdin: ${killed.ok ? killed.v : killed.e} after ${took} ms; ` +
      `then list: ${list.ok ? list.v.length + ' processes' : list.e} in ${lt} ms; second kill: ${again.ok ? again.v : again.e}; ` +
      `the blocked sendStdin: ${w === 'pending' ? 'pending' : w.ok ? 'succeeded' : w.e.message.split('\n')[0]}`)
  }
  const w = await Promise.race([write, new Promise((res) => setTimeout(() => res('pending'), 10000))])
  assert.notEqual(w, 'pending', 'the blocked sendStdin did not return after kill')
  assert.equal(w.ok, false, 'an 8 MiB sendStdin to a process that never read it succeeded')
  await assert.rejects(sleeper.wait(), (e) => e instanceof CommandExitError)
  ok(`kill answers during a blocked sendStdin, which then fails (${w.e.message.split('\n')[0]})`)

  console.log(`${step} passed, 0 failed`)
} catch (e) {
  console.error(`not ok ${step + 1} - ${pkg}:`, e)
  process.exitCode = 1
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
