// Stock-SDK acceptance: the E2B JS SDK (the version named by SDK_PACKAGE,
// unchanged) and @e2b/code-interpreter against a real `spore up`.
// Needs E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. Exits non-zero on the
// first failed check; prints one line per step.
import assert from 'node:assert/strict'

const pkg = process.env.SDK_PACKAGE || 'e2b'
const e2b = await import(pkg)
const { Sandbox, CommandExitError, FileNotFoundError, SandboxNotFoundError, NotFoundError } = e2b
const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter')
const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY

let step = 0
const t0 = Date.now()
const ok = (what) => console.log(`ok ${++step} - ${pkg}: ${what} (${Date.now() - t0} ms)`)
const created = []
const track = (s) => { created.push(s.sandboxId); return s }

async function rest(method, path, body) {
  const res = await fetch(api + path, {
    method,
    headers: { 'X-API-KEY': key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined, headers: res.headers }
}

try {
  const tag = `run-${process.pid}-${Date.now()}`
  const sbx = track(await Sandbox.create({ metadata: { suite: tag, role: 'main' }, envs: { FROM_CREATE: 'yes' } }))
  ok(`create ${sbx.sandboxId}`)

  // commands
  let r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.stdout, 'hello\n'); assert.equal(r.stderr, 'oops\n'); assert.equal(r.exitCode, 0)
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  r = await sbx.commands.run('echo $FROM_CREATE $MINE; pwd', { envs: { MINE: 'mine' }, cwd: '/tmp' })
  assert.equal(r.stdout, 'yes mine\n/tmp\n')
  r = await sbx.commands.run('whoami', { user: 'root' })
  assert.equal(r.stdout, 'root\n')
  const bg = await sbx.commands.run('read line; echo "got:$line"; sleep 600', { background: true, stdin: true })
  await sbx.commands.sendStdin(bg.pid, 'ping\n')
  for (let i = 0; i < 100 && !bg.stdout.includes('got:ping'); i++) await new Promise((res) => setTimeout(res, 50))
  assert.ok(bg.stdout.includes('got:ping'), `background stdout: ${bg.stdout}`)
  ok('commands: stdout, stderr, exit codes, env, cwd, user, background + stdin')

  // files
  await sbx.files.write('/home/user/dir/a.txt', 'text content')
  assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'text content')
  const bin = new Uint8Array(256 * 1024).map((_, i) => (i * 7) % 256)
  await sbx.files.write('/home/user/dir/b.bin', bin.buffer)
  const back = await sbx.files.read('/home/user/dir/b.bin', { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(bin))
  const names = (await sbx.files.list('/home/user/dir')).map((e) => e.name).sort()
  assert.deepEqual(names, ['a.txt', 'b.bin'])
  assert.equal(await sbx.files.exists('/home/user/dir/a.txt'), true)
  await sbx.files.rename('/home/user/dir/a.txt', '/home/user/dir/c.txt')
  assert.equal(await sbx.files.exists('/home/user/dir/a.txt'), false)
  await sbx.files.remove('/home/user/dir/c.txt')
  assert.equal(await sbx.files.exists('/home/user/dir/c.txt'), false)
  await assert.rejects(sbx.files.read('/home/user/nope.txt'), (e) => e instanceof FileNotFoundError || e instanceof NotFoundError)
  await sbx.files.write('/home/user/before-fork.txt', 'pre-fork')
  ok('files: write, read, binary, list, exists, rename, remove, missing file error')

  // code interpreter: a variable persists
  const ci = track(await CodeSandbox.create({ metadata: { suite: tag, role: 'ci' } }))
  let ex = await ci.runCode('x = 41')
  assert.equal(ex.error, undefined)
  ex = await ci.runCode('x + 1')
  assert.equal(ex.text, '42')
  ex = await ci.runCode('print("streamed")\n1/0')
  assert.deepEqual(ex.logs.stdout, ['streamed\n'])
  assert.equal(ex.error.name, 'ZeroDivisionError')
  ok('runCode: variable persists, logs, errors')

  // code contexts: the SDK authenticates these calls with the traffic token
  const cctx = await ci.createCodeContext()
  assert.ok(cctx.id)
  await ci.runCode('y = "in context"', { context: cctx })
  assert.equal((await ci.runCode('y', { context: cctx })).text, "'in context'")
  assert.ok((await ci.listCodeContexts()).some((c) => c.id === cctx.id))
  await ci.restartCodeContext(cctx)
  assert.equal((await ci.runCode('y', { context: cctx })).error?.name, 'NameError')
  await ci.removeCodeContext(cctx)
  assert.ok(!(await ci.listCodeContexts()).some((c) => c.id === cctx.id))
  ok('code contexts: create, run in, list, restart, remove')

  // snapshot, fork(3)
  const snap = await sbx.createSnapshot()
  assert.ok(snap.snapshotId)
  await ci.runCode('x = "pre-fork"')
  const forks = await ci.fork({ count: 3 })
  assert.equal(forks.length, 3)
  for (const f of forks) { assert.ok(!(f instanceof Error), String(f)); track(f) }
  for (const [i, f] of forks.entries()) {
    const got = await f.runCode('x')
    assert.equal(got.text, "'pre-fork'")
    await f.runCode(`x = "fork ${i}"`)
    await f.files.write('/home/user/mine.txt', `fork ${i}`)
  }
  for (const [i, f] of forks.entries()) {
    assert.equal((await f.runCode('x')).text, `'fork ${i}'`)
    assert.equal(await f.files.read('/home/user/mine.txt'), `fork ${i}`)
  }
  assert.equal((await ci.runCode('x')).text, "'pre-fork'")
  assert.equal(await ci.files.exists('/home/user/mine.txt'), false)
  const sbxForks = await sbx.fork({ count: 1 })
  track(sbxForks[0])
  assert.equal(await sbxForks[0].files.read('/home/user/before-fork.txt'), 'pre-fork')
  ok('createSnapshot, fork(3): forks see the pre-fork state, their writes stay their own')

  // getMetrics: the node's samples (every 5 s) in the window asked, or one read now
  const ms = await sbx.getMetrics({ start: new Date(t0 - 60000), end: new Date(Date.now() + 60000) })
  assert.ok(ms.length >= 1, `metrics: ${JSON.stringify(ms)}`)
  for (const m of ms) {
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp) && m.timestamp.getTime() >= t0 - 60000, `metric timestamp ${m.timestamp}`)
    assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
  }
  assert.deepEqual(await sbx.getMetrics({ start: new Date(t0 - 3600000), end: new Date(t0 - 1800000) }), [])
  ok(`getMetrics: ${ms.length} samples in the window, none before the sandbox`)

  // create from the snapshot
  const fromSnap = track(await Sandbox.create(snap.snapshotId, { metadata: { suite: tag, role: 'from-snapshot' } }))
  assert.equal(await fromSnap.files.exists('/home/user/dir/b.bin'), true)
  ok('create from a snapshot')

  // rollback via REST: files come back, same ID
  await sbx.files.write('/home/user/dir/b.bin', 'broken')
  const rb = await rest('POST', `/sandboxes/${sbx.sandboxId}/rollback`, { snapshotID: snap.snapshotId })
  assert.equal(rb.status, 200, JSON.stringify(rb.body))
  assert.equal(rb.body.sandboxID, sbx.sandboxId)
  const after = await Sandbox.connect(sbx.sandboxId)
  assert.deepEqual(Buffer.from(await after.files.read('/home/user/dir/b.bin', { format: 'bytes' })), Buffer.from(bin))
  ok('rollback via REST keeps the ID and restores files')

  // pause, second pause, connect: a background process survived
  const bg2 = await after.commands.run('sleep 600', { background: true })
  assert.equal(await after.pause(), true)
  assert.equal(await Sandbox.pause(after.sandboxId), false)
  const info = await Sandbox.getInfo(after.sandboxId)
  assert.equal(info.state, 'paused')
  const resumed = await Sandbox.connect(after.sandboxId)
  const procs = await resumed.commands.list()
  assert.ok(procs.some((p) => p.pid === bg2.pid), `processes after resume: ${JSON.stringify(procs)}`)
  assert.equal((await Sandbox.getInfo(after.sandboxId)).state, 'running')
  ok('pause, second pause is false, connect resumes and the background process survived')

  // list with a metadata filter and paging
  const seen = new Set()
  const pager = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 2 })
  let pages = 0
  while (pager.hasNext) {
    for (const s of await pager.nextItems()) seen.add(s.sandboxId)
    pages++
  }
  for (const id of created) assert.ok(seen.has(id), `list misses ${id}`)
  assert.ok(pages >= 2, `pages: ${pages}`)
  const one = await Sandbox.list({ query: { metadata: { suite: tag, role: 'from-snapshot' } } }).nextItems()
  assert.deepEqual(one.map((s) => s.sandboxId), [fromSnap.sandboxId])
  const forked = await Sandbox.list({ query: { metadata: { suite: tag, role: 'ci' } } }).nextItems()
  assert.equal(forked.length, 4, 'the code sandbox and its 3 forks (forks keep their parent\'s metadata)')
  ok(`list: metadata filter and paging (${pages} pages)`)

  // errors for unknown sandboxes
  await assert.rejects(Sandbox.connect('i0000000000000000000'), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  await assert.rejects(Sandbox.getInfo('i0000000000000000000'), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  assert.equal(await Sandbox.kill('i0000000000000000000'), false)
  if (e2b.Template) {
    // Template.exists: true for a template's name, false for none; tags of
    // the built-in template (none) and of no template (an error).
    assert.equal(await e2b.Template.exists('base'), true)
    assert.equal(await e2b.Template.exists(`no-such-template-${process.pid}`), false)
    assert.deepEqual(await e2b.Template.getTags('base'), [])
    await assert.rejects(e2b.Template.getTags(`no-such-template-${process.pid}`))
  }
  if (e2b.Volume) {
    // Volumes are served (docs/volumes.md): the list is an array.
    assert.ok(Array.isArray(await e2b.Volume.list()))
  }
  {
    // E2B's v2 template list: an array with the built-in template, in
    // pages (X-Next-Token while more follow).
    const res = await fetch(`${process.env.E2B_API_URL}/v2/templates?limit=100`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
    const body = await res.json()
    assert.equal(res.status, 200)
    assert.ok(Array.isArray(body) && body.some((t) => t.names.includes('base')), JSON.stringify(body))
    // E2B's team list: the key's team (the operator key acts in the
    // default one).
    const teams = await (await fetch(`${process.env.E2B_API_URL}/teams`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })).json()
    assert.ok(teams.some((t) => t.teamID === 'default' && t.isDefault), JSON.stringify(teams))
  }
  ok('errors for unknown sandboxes; Template.exists')

  // kill everything
  for (const id of created) assert.equal(await Sandbox.kill(id), true)
  created.length = 0
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  ok('kill')
  console.log(`${step} passed, 0 failed`)
  console.log(`# done in ${Date.now() - t0} ms`)
} catch (e) {
  console.error(`not ok ${step + 1} - ${pkg}:`, e)
  for (const id of created) await Sandbox.kill(id).catch(() => {})
  process.exit(1)
}
