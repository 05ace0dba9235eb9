// A sandbox's and a snapshot's filesystem exported as OCI images to a
// registry (REGISTRY, plain HTTP, given to the server as insecure), then
// cold started elsewhere: templates built from those images (the stock
// SDK's Template().fromImage) have the changes.
import assert from 'node:assert/strict'
import { Sandbox, Template } from 'e2b'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
const registry = process.env.REGISTRY
let passed = 0
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg}`) }
const post = async (path, body) => {
  const res = await fetch(api + path, { method: 'POST', headers: { 'X-API-Key': key, 'Content-Type': 'application/json' }, body: JSON.stringify(body) })
  return { status: res.status, body: await res.json() }
}
const run = async (sbx, cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout.trim()

const sbx = await Sandbox.create()
let snapshotId
try {
  await sbx.files.write('/home/user/new.txt', 'exported\n')
  await sbx.commands.run('echo changed > /etc/motd && rm /etc/issue && mkdir -p /srv/tree/a && echo deep > /srv/tree/a/b.txt', { user: 'root' })
  const res = await post(`/sandboxes/${sbx.sandboxId}/export`, { ref: `${registry}/exported/sandbox:1` })
  assert.equal(res.status, 200, JSON.stringify(res.body))
  assert.match(res.body.digest, /^sha256:[0-9a-f]{64}$/)
  assert.ok(res.body.layers >= 2 && res.body.changed > 0 && res.body.deleted >= 1, JSON.stringify(res.body))
  ok('a running sandbox exported (root filesystem + its changes, with a whiteout)')

  await sbx.files.write('/home/user/after.txt', 'in the snapshot\n')
  snapshotId = (await sbx.createSnapshot()).snapshotId
  const snap = await post(`/snapshots/${snapshotId}/export`, { ref: `${registry}/exported/snapshot:1` })
  assert.equal(snap.status, 200, JSON.stringify(snap.body))
  ok('a snapshot exported')

  for (const [path, body, want] of [
    ['/sandboxes/bad..id/export', { ref: `${registry}/x:1` }, 400],
    ['/sandboxes/izzzzzzzzzzzzzzzzzzz/export', { ref: `${registry}/x:1` }, 404],
    [`/sandboxes/${sbx.sandboxId}/export`, { ref: '' }, 400],
    [`/sandboxes/${sbx.sandboxId}/export`, { ref: 'Not A Ref!' }, 400],
    [`/sandboxes/${sbx.sandboxId}/export`, { ref: `${registry}/x:1`, username: 'u' }, 400],
    [`/sandboxes/${sbx.sandboxId}/export`, { ref: '127.0.0.1:1/not-insecure:1' }, 400],
  ]) {
    const r = await post(path, body)
    assert.equal(r.status, want, `${path} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`)
    assert.ok(r.body.message, 'a {code,message} error')
  }
  ok('bad exports are refused with a 4xx')
} finally {
  await sbx.kill()
}

// Cold start from the images: templates built from them.
await Template.build(Template().fromImage(`${registry}/exported/sandbox:1`), 'from-export')
await Template.build(Template().fromImage(`${registry}/exported/snapshot:1`), 'from-export-snap')
const c = await Sandbox.create('from-export')
const d = await Sandbox.create('from-export-snap')
try {
  assert.equal(await c.files.read('/home/user/new.txt'), 'exported\n', 'a new file')
  assert.equal(await c.files.read('/etc/motd'), 'changed\n', 'a changed file')
  assert.equal(await run(c, 'test -e /etc/issue && echo there || echo gone'), 'gone', 'a deleted file')
  assert.equal(await c.files.read('/srv/tree/a/b.txt'), 'deep\n', 'a new tree')
  assert.equal(await run(c, 'id -un; pwd'), 'user\n/home/user', 'the default user and workdir')
  assert.equal(await run(c, 'python3 -c "print(1+1)"'), '2', "the base root filesystem's programs")
  assert.equal(await c.files.read('/etc/hostname') !== '', true)
  assert.equal(await d.files.read('/home/user/after.txt'), 'in the snapshot\n', "the snapshot's file")
  assert.equal(await d.files.read('/home/user/new.txt'), 'exported\n')
} finally {
  await c.kill()
  await d.kill()
}
ok('templates from the exported images have the changes')

console.log(`${passed} passed, 0 failed`)
