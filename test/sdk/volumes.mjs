// The stock SDK's Volume module against Spore, unchanged: create, getInfo
// by ID, connect, list, destroy (true, then false), the not-found errors;
// the content API (its own base URL, E2B_VOLUME_API_URL, here the API's)
// with the volume's token; a volume mounted in two sandboxes shares its
// files with them and with the content API.
// Prints "N passed, 0 failed".
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'

process.env.E2B_VOLUME_API_URL = process.env.E2B_API_URL
const run = Date.now().toString(36)
const name = `sdk-${run}`
let passed = 0
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg}`) }

const vol = await Volume.create(name)
assert.match(vol.volumeId, /^v[a-z0-9]{19}$/)
assert.equal(vol.name, name)
assert.match(vol.token, /^spv_/)
ok('Volume.create')

const info = await Volume.getInfo(vol.volumeId)
assert.deepEqual([info.volumeId, info.name, info.token], [vol.volumeId, name, vol.token])
const conn = await Volume.connect(vol.volumeId)
assert.equal(conn.token, vol.token)
ok('Volume.getInfo and Volume.connect')

const other = await Volume.create(`${name}-b`)
assert.notEqual(other.token, vol.token)
const list = await Volume.list()
assert.deepEqual(list.filter((v) => v.name.startsWith(name)).map((v) => v.name), [name, `${name}-b`])
assert.equal(JSON.stringify(list).includes('spv_'), false, 'no token in a list')
ok('Volume.list')

await assert.rejects(Volume.create(name), (e) => e instanceof VolumeError && /exists/.test(e.message))
await assert.rejects(Volume.create('../etc'), (e) => e instanceof VolumeError && /volume name/.test(e.message))
await assert.rejects(Volume.getInfo('vnonexistent000000000'), VolumeNotFoundError)
ok('refusals: a name in use, a bad name, an unknown volume')

// The content API, with the volume's token: files without a sandbox.
const made = await vol.makeDir('/docs')
assert.equal(made.type, 'directory')
const written = await vol.writeFile('/docs/readme.md', 'hello from the SDK')
assert.deepEqual([written.type, written.size, written.path], ['file', 18, '/docs/readme.md'])
assert.equal(await vol.readFile('/docs/readme.md'), 'hello from the SDK')
assert.deepEqual(Buffer.from(await vol.readFile('/docs/readme.md', { format: 'bytes' })).toString(), 'hello from the SDK')
assert.deepEqual((await vol.list('/')).map((e) => e.name), ['docs'])
assert.deepEqual((await vol.list('/', { depth: 2 })).map((e) => e.path).sort(), ['/docs', '/docs/readme.md'])
assert.equal(await vol.exists('/docs/readme.md'), true)
assert.equal(await vol.exists('/docs/nope.md'), false)
assert.equal((await vol.getInfo('/docs')).type, 'directory')
assert.ok((await vol.getInfo('/docs/readme.md')).mtime instanceof Date)
assert.equal((await vol.updateMetadata('/docs/readme.md', { mode: 0o600 })).mode, 0o600)
await assert.rejects(vol.readFile('/docs/nope.md'), VolumePathNotFoundError)
await assert.rejects(vol.readFile('/../../etc/passwd'), (e) => e instanceof VolumeError && !/root:/.test(e.message))
await assert.rejects(new Volume(vol.volumeId, name, other.token).readFile('/docs/readme.md'), (e) => !(e instanceof VolumePathNotFoundError) && /token/.test(e.message))
ok('the content API: makeDir, writeFile, readFile, list, exists, getInfo, updateMetadata; refusals')

// Mounted in two sandboxes (by Volume and by name): each sees the
// other's writes; getInfo reports the mounts; a mounted volume is not
// destroyed; a system path is refused.
const a = await Sandbox.create({ volumeMounts: { '/home/user/data': vol } })
const b = await Sandbox.create({ volumeMounts: { '/mnt/shared': name } })
try {
  await a.commands.run('echo written-in-a > /home/user/data/note.txt')
  assert.equal((await b.commands.run('cat /mnt/shared/note.txt')).stdout, 'written-in-a\n')
  await b.files.write('/mnt/shared/from-b.txt', 'hello from b')
  assert.equal(await a.files.read('/home/user/data/from-b.txt'), 'hello from b')
  // The content API and the sandboxes see the same files.
  // (readme.md is 0600 and root's since updateMetadata: user cannot read it.)
  await assert.rejects(a.commands.run('cat /home/user/data/docs/readme.md'), (e) => /Permission denied/.test(e.stderr))
  assert.equal((await a.commands.run('cat /home/user/data/docs/readme.md', { user: 'root' })).stdout, 'hello from the SDK')
  assert.equal(await vol.readFile('/from-b.txt'), 'hello from b')
  const ai = await Sandbox.getInfo(a.sandboxId)
  assert.deepEqual(ai.volumeMounts, [{ name, path: '/home/user/data' }])
  ok('a volume mounted in two sandboxes')

  // Read-only (Spore's readOnly, through REST): reads, and EROFS on writes.
  const res = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`, {
    method: 'POST', headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', volumeMounts: [{ name, path: '/mnt/ro', readOnly: true }] }),
  })
  assert.equal(res.status, 201)
  const ro = await Sandbox.connect((await res.json()).sandboxID)
  try {
    assert.equal((await ro.commands.run('cat /mnt/ro/note.txt')).stdout, 'written-in-a\n')
    await assert.rejects(ro.commands.run('echo x > /mnt/ro/nope'), (e) => /Read-only file system/.test(e.stderr))
    assert.deepEqual((await Sandbox.getInfo(ro.sandboxId)).volumeMounts, [{ name, path: '/mnt/ro', readOnly: true }])
  } finally {
    await ro.kill()
  }
  ok('a read-only mount')
  await vol.remove('/docs')
  assert.equal(await vol.exists('/docs'), false)
  assert.equal((await a.commands.run('test -e /home/user/data/docs || echo gone')).stdout, 'gone\n')
  ok('vol.remove, seen in a sandbox')

  await assert.rejects(Volume.destroy(vol.volumeId), (e) => e instanceof VolumeError && /mounted by sandbox/.test(e.message))
  await assert.rejects(Sandbox.create({ volumeMounts: { '/etc': vol } }), (e) => /system directory/.test(e.message))
  await assert.rejects(Sandbox.create({ volumeMounts: { '/data': 'no-such-volume' } }), (e) => /no volume/.test(e.message))
  ok('refusals: destroy while mounted, a system path, an unknown volume')
} finally {
  await a.kill()
  await b.kill()
}

assert.equal(await Volume.destroy(vol.volumeId), true)
assert.equal(await Volume.destroy(vol.volumeId), false)
assert.equal(await Volume.destroy(other.volumeId), true)
await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
ok('Volume.destroy')

console.log(`${passed} passed, 0 failed`)
