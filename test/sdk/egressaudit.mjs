// The sandbox side of TestEgressAuditThroughTheAPI, through the stock
// SDK, unchanged: one outside host reached, one refused by denyOut; the
// sandbox is then killed and its ID printed after "SANDBOX:". Needs E2B_*
// and PEER_A, PEER_B (http://host:port of two outside test servers).
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const a = process.env.PEER_A
const b = process.env.PEER_B
const reach = async (sbx, url) => (await sbx.commands.run(`curl -s -m 3 ${url}/ || echo blocked`)).stdout.trim()

const sbx = await Sandbox.create({ network: { denyOut: [`${new URL(b).hostname}/32`] } })
try {
  assert.equal(await reach(sbx, a), 'outside', 'an address no rule denies')
  console.log('ok 1 - reached the allowed host')
  assert.equal(await reach(sbx, b), 'blocked', 'the denied address')
  console.log('ok 2 - refused the denied host')
} finally {
  await sbx.kill()
}
console.log('2 passed, 0 failed')
console.log('SANDBOX:' + sbx.sandboxId)
