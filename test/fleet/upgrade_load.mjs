// The background load of TestRollingUpgrade (upgrade_test.go): the stock E2B
// SDK creating sandboxes (lifecycle onTimeout pause, autoResume), running
// commands in them (each connects first, which resumes a sandbox a drain
// hibernated, on whichever node), taking snapshots and killing some, through
// both API replicas in turn, until the file LOAD_STOP exists.
//
// Each command appends a tag of its own to /home/user/ops in its sandbox; the
// test then finds every tag of every command that succeeded there (and in
// the snapshots taken after it).
//
// Retries, each counted: a 503 (ServiceBusyError, or an envd call answered
// 503), after a second (the API's Retry-After); and a connection refused,
// or closed before an answer, at once on the other replica: what a load
// balancer in front of the replicas routes around (the test checks each
// came from a replica while it was being replaced; a command's "fetch
// failed", whose cause the SDK drops, counts when the replica refuses
// connections then: unansweredAtADownReplica). Every replica failing in a
// row is an outage, an error. Anything else is an error, not retried.
//
// A command whose stream was cut (undici's "terminated": a drain
// hibernated its sandbox under it; or, before its answer began, the
// proxy's 502 "went away before it answered", which the SDK raises on a
// command's start as SandboxNotFoundError) is not retried either (it may
// have run): it is recorded in "cut" with its sandbox, tag and how, and
// the load then looks for its line (verify); a line found once counts the
// command as done. The test fails on any cut (a drain waits for the
// requests in flight before it hibernates) and reports where it fell and
// whether its line was found.
//
// Env: LOAD_URLS (the replicas, comma-separated), E2B_API_KEY, LOAD_STOP,
// LOAD_WORKERS (default 2), LOAD_LIVE (sandboxes kept alive, default 4).
// Prints "RESULT:" and one JSON object.
import fs from 'node:fs'
import net from 'node:net'
const { Sandbox } = await import('e2b')

const urls = process.env.LOAD_URLS.split(',')
const stopFile = process.env.LOAD_STOP
const workers = Number(process.env.LOAD_WORKERS || 2)
const live = Number(process.env.LOAD_LIVE || 4)
const opts = (url) => ({ apiUrl: url, sandboxUrl: url, requestTimeoutMs: 120000 })

const res = { ops: [], retries503: [], refused: [], errors: [], cut: [], sandboxes: {}, failed: {}, killed: [], snapshots: [] }
const alive = [] // sandbox IDs the load may use
const busy = new Set() // sandboxes an op is working on: one op at a time per sandbox
let seq = 0

// connFailure gives the code of a connection-level failure in an error's
// causes (the SDK wraps them as "fetch failed"): refused, reset, or closed
// by the server before an answer. A replica being replaced refuses
// connections, and closes its idle keep-alive ones as it stops.
const connCodes = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_CLOSED'])
function connFailure(e) {
  for (let c = e, d = 0; c && d < 5; c = c.cause, d++) if (connCodes.has(c.code)) return c.code
  return undefined
}

// unansweredAtADownReplica: the SDK's command client wraps a failed fetch
// as "[unknown] fetch failed" and drops its cause, so a connection a
// replica being replaced refused cannot be told by its code. A fetch that
// failed with no answer at all, at a replica that refuses connections right
// now, is counted as refused ('ECONNREFUSED (probed)') and sent to the other
// replica. Were it a request the replica had taken, the command would run
// twice and its line be in the file twice, which the test checks.
async function unansweredAtADownReplica(e, url) {
  if (!/\bfetch failed\b/.test(String(e?.message ?? e)) || /\bterminated\b/.test(String(e?.message ?? e))) return undefined
  const { hostname, port } = new URL(url)
  const refused = await new Promise((resolve) => {
    const s = net.connect({ host: hostname, port: Number(port) })
    s.once('connect', () => { s.destroy(); resolve(false) })
    s.once('error', (err) => resolve(err.code === 'ECONNREFUSED'))
  })
  return refused ? 'ECONNREFUSED (probed)' : undefined
}

// describe gives an error's message with its causes' (the SDK wraps a
// refused or reset connection as "fetch failed").
function describe(e) {
  const parts = []
  for (let c = e, d = 0; c && d < 5; c = c.cause, d++) parts.push(`${c.name ?? ''}${c.code ? ' ' + c.code : ''}: ${c.message ?? c}`)
  return parts.join(' <- ').slice(0, 600)
}

// cutHow says how a command's call may have been cut: after its answer
// began (undici's "terminated", which the SDK may wrap, keeping the
// word), or before ("not running": the SDK's SandboxNotFoundError);
// undefined for any other error.
function cutHow(e) {
  for (let c = e, d = 0; c && d < 5; c = c.cause, d++) if (/\bterminated\b/.test(String(c.message ?? c))) return 'terminated'
  return e?.name === 'SandboxNotFoundError' ? 'not running' : undefined
}

const is503 = (e) => e?.name === 'ServiceBusyError' || /\b503\b|Service temporarily unavailable/.test(String(e?.message ?? e))

// attempt runs f(url) on the next replica in turn (every op alternates),
// retrying as the header of this file says; each retry and error is
// recorded with the op's name (and meta: the sandbox and the command's
// tag). A command's stream cut returns CUT.
const CUT = Symbol('cut')
let turn = 0
async function attempt(name, f, meta = {}) {
  let u = turn++ % urls.length
  let refusals = 0 // in a row: every replica refusing is an outage, not retried
  for (let tries = 0; ; tries++) {
    const url = urls[u]
    const t = Date.now()
    try {
      const out = await f(url)
      res.ops.push({ op: name, url, t, ms: Date.now() - t, sandbox: meta.sandbox })
      return out
    } catch (e) {
      const msg = describe(e)
      const how = meta.tag && cutHow(e)
      if (how) {
        res.cut.push({ op: name, url, began: t, t: Date.now(), msg, how, ...meta })
        return CUT
      }
      if (tries < 60 && is503(e)) {
        refusals = 0
        res.retries503.push({ op: name, url, t: Date.now(), msg })
        await new Promise((r) => setTimeout(r, 1000))
        continue
      }
      const code = connFailure(e) ?? (await unansweredAtADownReplica(e, url))
      if (code && ++refusals < urls.length) {
        res.refused.push({ op: name, url, began: t, t: Date.now(), msg })
        u = (u + 1) % urls.length
        continue
      }
      res.errors.push({ op: name, url, began: t, t: Date.now(), msg: code ? `every replica failed the connection: ${msg}` : msg, ...meta })
      return undefined
    }
  }
}

async function create() {
  const id = await attempt('create', async (url) => {
    const sb = await Sandbox.create({ ...opts(url), timeoutMs: 900000, lifecycle: { onTimeout: 'pause', autoResume: true }, metadata: { load: 'upgrade' } })
    return sb.sandboxId
  })
  if (id) {
    res.sandboxes[id] = []
    alive.push(id)
  }
}

// command runs cmd in sandbox id (connecting first, which resumes it) and
// returns its stdout as a number.
const command = (id, cmd) => async (url) => {
  const sb = await Sandbox.connect(id, opts(url))
  const r = await sb.commands.run(cmd, { timeoutMs: 60000 })
  return Number(r.stdout.trim())
}

async function run(id) {
  const tag = `op-${++seq}`
  let n = await attempt('run', command(id, `echo ${tag} >> /home/user/ops && grep -c . /home/user/ops`), { sandbox: id, tag })
  if (n === CUT) {
    // Its line is there once, or the cut lost the command's effect.
    const cut = res.cut[res.cut.length - 1]
    let found = CUT
    for (let i = 0; i < 3 && found === CUT; i++) {
      found = await attempt('verify', command(id, `grep -c -x -- ${tag} /home/user/ops || true`), { sandbox: id, tag: `verify-${tag}` })
    }
    cut.found = found === CUT ? -1 : found
    if (found === 1) {
      res.sandboxes[id].push(tag)
      return
    }
    n = undefined
  }
  if (n === undefined) {
    res.failed[id] = [...(res.failed[id] ?? []), tag] // its line may be there or not
    return
  }
  // One op at a time per sandbox: its file holds the tags of the commands
  // that succeeded (and maybe of some that failed), none lost by a
  // hibernation or a move.
  const want = res.sandboxes[id].length + 1
  const doubt = (res.failed[id] ?? []).length
  res.sandboxes[id].push(tag)
  if (n < want || n > want + doubt) {
    const t = Date.now()
    res.errors.push({ op: 'run', began: t, t, sandbox: id, tag, msg: `${id}: /home/user/ops has ${n} lines after ${tag}, want ${want}${doubt ? `-${want + doubt}` : ''}` })
  }
}

async function snapshot(id) {
  const tags = [...res.sandboxes[id]]
  const sn = await attempt('snapshot', async (url) => {
    await Sandbox.connect(id, opts(url))
    return Sandbox.createSnapshot(id, opts(url))
  })
  if (sn) res.snapshots.push({ snapshotId: sn.snapshotId, sandboxId: id, tags })
}

async function kill(id) {
  alive.splice(alive.indexOf(id), 1)
  const ok = await attempt('kill', (url) => Sandbox.kill(id, opts(url)))
  if (ok !== undefined) res.killed.push(id)
}

// pick returns a sandbox no other op is working on, in turn.
let picks = 0
const pick = () => {
  const free = alive.filter((id) => !busy.has(id))
  return free.length ? free[picks++ % free.length] : undefined
}

async function worker(w) {
  for (let i = w; !fs.existsSync(stopFile); i += workers) {
    const step = Math.floor(i / workers)
    if (alive.length < live) {
      await create()
      continue
    }
    const id = pick()
    if (!id) {
      await new Promise((r) => setTimeout(r, 200))
      continue
    }
    busy.add(id)
    try {
      if (step % 24 === 23) await kill(id)
      else if (step % 4 === 3) await snapshot(id)
      else await run(id)
    } finally {
      busy.delete(id)
    }
  }
}

const t0 = Date.now()
await Promise.all([...Array(workers).keys()].map(worker))
res.ms = Date.now() - t0
console.log('RESULT:' + JSON.stringify(res))
