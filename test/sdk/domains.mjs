// E2B's domain rules through the stock SDK, unchanged: names and
// wildcards in allowOut/denyOut, at create and in updateNetwork. Needs
// E2B_* and OTHER_IP (the address of other.test, whose server answers
// "other"; allowed.test's answers "allowed").
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const otherIP = process.env.OTHER_IP
const get = async (sbx, args) => (await sbx.commands.run(`curl -sk -m 3 ${args} || echo blocked`)).stdout.trim()

const sbx = await Sandbox.create({ network: { denyOut: ['0.0.0.0/0'], allowOut: ['allowed.test', '*.wild.test'] } })
try {
  assert.equal(await get(sbx, 'http://allowed.test/'), 'allowed', 'an allowed name over HTTP (its Host)')
  assert.equal(await get(sbx, 'https://allowed.test/'), 'allowed', 'an allowed name over HTTPS (its SNI)')
  assert.equal(await get(sbx, 'http://a.wild.test/'), 'other', 'a name the wildcard covers')
  assert.equal(await get(sbx, 'http://other.test/'), 'blocked', 'a name no rule allows')
  assert.equal(await get(sbx, 'https://other.test/'), 'blocked', 'the same over HTTPS')
  assert.equal(await get(sbx, `http://${otherIP}/`), 'blocked', "a denied server by its address")
  // An allowed name sent to another server's address reaches the name's
  // own server: the proxy resolves the name itself.
  assert.equal(await get(sbx, `-H 'Host: allowed.test' http://${otherIP}/`), 'allowed', 'an allowed Host sent to another address')
  assert.equal(await get(sbx, `--resolve allowed.test:443:${otherIP} https://allowed.test/`), 'allowed', 'an allowed SNI sent to another address')
  console.log('ok 1 - create: only the allowed names answer, on HTTP and HTTPS')

  await sbx.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['other.test'] })
  assert.equal(await get(sbx, 'http://allowed.test/'), 'blocked', 'no longer allowed after updateNetwork')
  assert.equal(await get(sbx, 'https://other.test/'), 'other', 'allowed by updateNetwork')
  console.log('ok 2 - updateNetwork swaps the allowed names')

  await assert.rejects(sbx.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: ['bad..name'] }), /400|invalid|domain/i)
  await assert.rejects(sbx.updateNetwork({ allowOut: ['*'] }), /400|invalid|domain/i)
  assert.equal(await get(sbx, 'https://other.test/'), 'other', 'a refused update changes nothing')
  assert.equal(await get(sbx, 'http://allowed.test/'), 'blocked', 'a refused update changes nothing')
  console.log('ok 3 - bad names are refused and change nothing')
} finally {
  await sbx.kill()
}

// denyOut by name with the rest open.
const open = await Sandbox.create({ network: { denyOut: ['other.test'] } })
try {
  assert.equal(await get(open, 'http://other.test/'), 'blocked', 'a denied name')
  assert.equal(await get(open, 'http://allowed.test/'), 'allowed', 'the rest is open')
  console.log('ok 4 - denyOut by name, the rest open')
} finally {
  await open.kill()
}
console.log('4 passed, 0 failed')
