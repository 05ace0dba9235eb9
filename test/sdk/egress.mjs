// E2B's egress rules through the stock SDK, unchanged: allow wins over
// deny at create and after updateNetwork, and updateNetwork replaces the
// lists. Needs E2B_* and PEER_A, PEER_B (http://host:port of two outside
// test servers answering "outside").
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const a = process.env.PEER_A
const b = process.env.PEER_B
const host = (u) => new URL(u).hostname
const reach = async (sbx, url) => (await sbx.commands.run(`curl -s -m 3 ${url}/ || echo blocked`)).stdout.trim()

const sbx = await Sandbox.create({ network: { denyOut: ['0.0.0.0/0', '::/0'], allowOut: [host(a)] } })
try {
  assert.equal(await reach(sbx, a), 'outside', 'the allowed address (allow wins over deny 0.0.0.0/0)')
  assert.equal(await reach(sbx, b), 'blocked', 'an address only denyOut covers')
  console.log('ok 1 - create: deny all but one address')

  await sbx.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: [`${host(b)}/32`] })
  assert.equal(await reach(sbx, a), 'blocked', 'no longer allowed after updateNetwork')
  assert.equal(await reach(sbx, b), 'outside', 'allowed by updateNetwork')
  console.log('ok 2 - updateNetwork swaps the allowed address')

  await sbx.updateNetwork({})
  assert.equal(await reach(sbx, a), 'outside', 'lists cleared by updateNetwork({})')
  assert.equal(await reach(sbx, b), 'outside')
  console.log('ok 3 - updateNetwork({}) clears the lists')

  await assert.rejects(sbx.updateNetwork({ allowOut: ['not-an-address'] }))
  assert.equal(await reach(sbx, a), 'outside', 'a refused update changes nothing')
  console.log('ok 4 - a bad entry is refused and changes nothing')
  console.log('4 passed, 0 failed')
} finally {
  await sbx.kill()
}
