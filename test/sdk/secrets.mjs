// The stock SDK's Secret module against Spore, unchanged: create, getInfo
// by ID and by name, exists, list (paged), update (a new version),
// destroy, and fill's placeholder. Prints "N passed, 0 failed".
import assert from 'node:assert/strict'
import { Secret } from 'e2b'

const run = Date.now().toString(36)
const name = `sdk-${run}`
let passed = 0
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg}`) }

const info = await Secret.create(name, 'sk-sdk-value-1', { metadata: { owner: 'sdk-test' } })
assert.match(info.secretId, /^sec_/)
assert.equal(info.name, name)
assert.equal(info.version, 1)
assert.deepEqual(info.metadata, { owner: 'sdk-test' })
assert.ok(info.createdAt instanceof Date && !isNaN(info.createdAt))
ok('Secret.create')

for (const ref of [info.secretId, name]) {
  const got = await Secret.getInfo(ref)
  assert.equal(got.secretId, info.secretId)
  assert.equal(JSON.stringify(got).includes('sk-sdk-value'), false, 'no value in getInfo')
}
ok('Secret.getInfo by ID and by name')

assert.equal(await Secret.exists(name), true)
assert.equal(await Secret.exists(`missing-${run}`), false)
ok('Secret.exists true and false')

await assert.rejects(Secret.create(name, 'again'), (e) => /exists/i.test(e.message))
ok('a second secret of one name is refused')

const extra = []
for (let i = 0; i < 3; i++) extra.push(await Secret.create(`${name}-p${i}`, `v${i}`))
const p = Secret.list({ limit: 2 })
const seen = []
let pages = 0
while (p.hasNext) {
  const items = await p.nextItems()
  pages++
  seen.push(...items.map((s) => s.name))
}
assert.ok(pages >= 2, `paged (${pages} pages)`)
for (const n of [name, `${name}-p0`, `${name}-p1`, `${name}-p2`]) assert.ok(seen.includes(n), `${n} listed`)
ok('Secret.list pages through every secret')

const up = await Secret.update(name, 'sk-sdk-value-2')
assert.equal(up.version, 2)
assert.equal(up.secretId, info.secretId)
await assert.rejects(Secret.update(`missing-${run}`, 'x'), (e) => e.constructor.name === 'SecretNotFoundError')
ok('Secret.update makes version 2; an unknown secret is SecretNotFoundError')

assert.equal(Secret.fill(name), `\${e2b.secrets.${name}}`)
ok('Secret.fill')

assert.equal(await Secret.destroy(name), true)
assert.equal(await Secret.destroy(name), false)
assert.equal(await Secret.exists(name), false)
for (const s of extra) assert.equal(await Secret.destroy(s.secretId), true)
ok('Secret.destroy true, then false')

console.log(`${passed} passed, 0 failed`)
