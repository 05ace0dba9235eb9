// Two teams through the stock SDK, unchanged: each sees only its own
// sandboxes and secrets, the other team's sandbox is "not found" to
// every call (getInfo, connect, kill, setTimeout), and names are per
// team; team B's quota of one sandbox refuses a second create (the
// error names the quota) and admits one again after a kill; template
// names are per team. KEY_A and
// KEY_B are the two teams' keys. Prints "N passed, 0 failed".
import assert from 'node:assert/strict'
import { Sandbox, Secret, Template, NotFoundError } from 'e2b'

const A = { apiKey: process.env.KEY_A }
const B = { apiKey: process.env.KEY_B }
let passed = 0
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg}`) }
const run = Date.now().toString(36)

const sa = await Sandbox.create('base', { ...A, timeoutMs: 120_000, metadata: { run } })
const sb = await Sandbox.create('base', { ...B, timeoutMs: 120_000, metadata: { run } })
ok('each team creates a sandbox')

await assert.rejects(Sandbox.create('base', { ...B, timeoutMs: 60_000, metadata: { run } }), (e) => /quota sandboxes/.test(e.message))
ok("over its quota, team B's second create is refused, naming the quota")

const ids = async (opts) => (await Sandbox.list({ ...opts, query: { metadata: { run } } }).nextItems()).map((s) => s.sandboxId)
assert.deepEqual(await ids(A), [sa.sandboxId])
assert.deepEqual(await ids(B), [sb.sandboxId])
ok('each team lists its own sandboxes only')

await assert.rejects(Sandbox.getInfo(sa.sandboxId, B), (e) => e instanceof NotFoundError || /not found/i.test(e.message))
await assert.rejects(Sandbox.connect(sa.sandboxId, B), (e) => /not found/i.test(e.message))
await assert.rejects(Sandbox.setTimeout(sa.sandboxId, 60_000, B), (e) => /not found/i.test(e.message))
assert.equal(await Sandbox.kill(sa.sandboxId, B), false)
ok("the other team's sandbox is not found to getInfo, connect, setTimeout and kill")

const r = await sa.commands.run('echo still-here')
assert.equal(r.stdout.trim(), 'still-here')
assert.equal((await Sandbox.getInfo(sa.sandboxId, A)).sandboxId, sa.sandboxId)
ok("team A's sandbox is untouched")

const name = `shared-${run}`
const secA = await Secret.create(name, 'value-of-a', A)
const secB = await Secret.create(name, 'value-of-b', B)
assert.notEqual(secA.secretId, secB.secretId)
assert.equal((await Secret.getInfo(name, A)).secretId, secA.secretId)
assert.equal((await Secret.getInfo(name, B)).secretId, secB.secretId)
await assert.rejects(Secret.getInfo(secA.secretId, B))
assert.equal(await Secret.destroy(secA.secretId, B), false)
assert.equal(await Secret.exists(name, A), true)
ok('secret names are per team; the other team cannot read or delete one')

assert.equal(await Sandbox.kill(sa.sandboxId, A), true)
assert.equal(await Sandbox.kill(sb.sandboxId, B), true)
await Secret.destroy(secA.secretId, A)
await Secret.destroy(secB.secretId, B)
ok('each team removes its own')

const again = await Sandbox.create('base', { ...B, timeoutMs: 60_000, metadata: { run } })
assert.deepEqual(await ids(B), [again.sandboxId])
ok('after the kill, team B creates again within its quota')

// Template names are per team: each team saves a sandbox as a template of
// the same name (Spore's snapshot route); each team's creates from that
// name start from its own, and the other team's is invisible to it.
const rest = async (method, path, opts, body) => {
  const res = await fetch(`${process.env.E2B_API_URL}${path}`, {
    method, headers: { 'X-API-Key': opts.apiKey, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}
const tname = `same-${run}`
const aSrc = await Sandbox.create('base', { ...A, timeoutMs: 60_000, metadata: { run } })
for (const [sbx, opts, who] of [[aSrc, A, 'a'], [again, B, 'b']]) {
  await sbx.files.write('/home/user/team.txt', who)
  const res = await rest('POST', `/sandboxes/${sbx.sandboxId}/snapshots`, opts, { name: tname, template: true })
  assert.equal(res.status, 201, JSON.stringify(res.body))
  assert.deepEqual(res.body.names, [tname])
  assert.equal(await Sandbox.kill(sbx.sandboxId, opts), true)
}
assert.equal(await Template.exists(tname, A), true)
assert.equal(await Template.exists(tname, B), true)
for (const [opts, who] of [[A, 'a'], [B, 'b']]) {
  const sbx = await Sandbox.create(tname, { ...opts, timeoutMs: 60_000, metadata: { run } })
  assert.equal(await sbx.files.read('/home/user/team.txt'), who, `team ${who}'s create from ${tname}`)
  assert.equal(await Sandbox.kill(sbx.sandboxId, opts), true)
}
ok('template names are per team: each team creates from its own template of a shared name')

assert.equal((await rest('DELETE', `/templates/${tname}`, B)).status, 204)
assert.equal(await Template.exists(tname, B), false)
assert.equal(await Template.exists(tname, A), true)
assert.equal((await rest('DELETE', `/templates/${tname}`, A)).status, 204)
assert.equal(await Template.exists(tname, A), false)
ok("removing one team's template leaves the other's")

console.log(`${passed} passed, 0 failed`)
