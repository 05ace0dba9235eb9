// Credentials injected at egress through the stock SDK, unchanged: a
// secret (Secret.create), a network rule for allowed.test whose header
// holds Secret.fill's placeholder; the sandbox's HTTPS requests there
// reach the server with the secret's value while the sandbox never sees
// it. Needs E2B_*, SECRET_VALUE, ROTATED_VALUE. The test server answers
// "auth:ok" (the first value), "auth:rotated", "auth:none" or
// "auth:other", never the header itself. Leaves the sandbox running (for
// the snapshot the Go side greps) and prints its ID after "SANDBOX:".
import assert from 'node:assert/strict'
import { Sandbox, Secret } from 'e2b'

const value = process.env.SECRET_VALUE
const rotated = process.env.ROTATED_VALUE
const name = `token-${Date.now().toString(36)}`
await Secret.create(name, value)
const rules = { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] }
const run = async (sbx, cmd) => {
  try {
    return (await sbx.commands.run(cmd)).stdout.trim()
  } catch (e) {
    return `failed: ${e.stdout ?? ''} ${e.stderr ?? e.message}`.trim()
  }
}
let passed = 0
const t0 = Date.now()
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg} (at ${Date.now() - t0} ms)`) }

const sbx = await Sandbox.create({ network: { rules } })
assert.equal(await run(sbx, 'curl -s -m 5 https://allowed.test/'), 'auth:ok', 'curl, trusting the system bundle (no -k)')
assert.equal(await run(sbx, "curl -s -m 5 -H 'Authorization: Bearer mine' https://allowed.test/"), 'auth:ok', "the sandbox's own header is replaced")
assert.equal(await run(sbx, `python3 -c "import urllib.request; print(urllib.request.urlopen('https://allowed.test/', timeout=5).read().decode())"`), 'auth:ok', 'Python')
ok('HTTPS requests to the rule\'s domain carry the secret (curl, Python)')

assert.equal(await run(sbx, 'curl -sk -m 5 https://other.test/'), 'auth:none', 'no rule: nothing injected')
assert.equal(await run(sbx, 'curl -s -m 5 http://allowed.test/'), 'auth:none', 'plain HTTP: nothing injected')
ok('other domains and plain HTTP get nothing')

const env = await run(sbx, 'env')
assert.ok(!env.includes(value), 'the value is not in the environment')
assert.ok(env.includes('SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt'), 'clients are pointed at the system bundle')
// (Files and memory are searched from outside, in the snapshot: a search
// run in here would carry the value in.)
ok('the value is in no environment variable of the sandbox')

const info = await Sandbox.getInfo(sbx.sandboxId)
assert.deepEqual(info.network.rules, rules, 'getInfo shows the rules with the placeholder')
ok('getInfo returns the rules as given')

await Secret.update(name, rotated)
assert.equal(await run(sbx, 'curl -s -m 5 https://allowed.test/'), 'auth:rotated', 'the rotated value, at once')
await sbx.updateNetwork({})
assert.equal(await run(sbx, 'curl -sk -m 5 https://allowed.test/'), 'auth:none', 'an update without rules clears them')
await sbx.updateNetwork({ rules })
assert.equal(await run(sbx, 'curl -s -m 5 https://allowed.test/'), 'auth:rotated', 'rules given again by updateNetwork')
ok('Secret.update reaches the running sandbox; updateNetwork clears the rules when it omits them, and sets them again')

await assert.rejects(sbx.updateNetwork({ rules: { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill('no-such-secret')}` } } }] } }), /400|does not exist/)
await assert.rejects(sbx.updateNetwork({ rules: { '*': [{ transform: { headers: { 'X-A': '1' } } }] } }), /400|domain/)
await assert.rejects(sbx.updateNetwork({ rules: { 'allowed.test': [{ transform: { headers: { Host: 'evil.test' } } }] } }), /400|Host/)
assert.equal(await run(sbx, 'curl -s -m 5 https://allowed.test/'), 'auth:rotated', 'refused updates change nothing')
await assert.rejects(Sandbox.create({ network: { rules: { 'allowed.test': [{ transform: { headers: { A: `${Secret.fill('no-such-secret')}` } } }] } } }), /400|does not exist/)
ok('bad rules (unknown secret, bare *, Host) are refused and change nothing')

// A fork (Spore's REST route) shares the rules and the CA its copied
// trust store holds.
const fr = await fetch(`${process.env.E2B_API_URL}/sandboxes/${sbx.sandboxId}/fork`, {
  method: 'POST', headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' }, body: '{"count":1}',
})
assert.equal(fr.status, 201, 'fork')
const kid = await Sandbox.connect((await fr.json())[0].sandbox.sandboxID)
assert.equal(await run(kid, 'curl -s -m 5 https://allowed.test/'), 'auth:rotated', "the child's request")
await kid.kill()
ok('a fork injects the same, trusting the same CA')

// A marker only in this process' memory: the Go side finds it in the
// snapshot's memory image, so its grep for the secret can see memory.
await sbx.commands.run(`python3 -c "import time; m = 'SPOREMARK' + '-7f3e' * 4; time.sleep(3000)"`, { background: true })
await Secret.destroy(name)
console.log(`${passed} passed, 0 failed`)
console.log('SANDBOX:' + sbx.sandboxId)
process.exit(0) // the background command's stream would hold the process open
