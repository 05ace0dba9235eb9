// E2B's network settings through the stock SDK, unchanged: allow wins over
// deny at create and after updateNetwork, updateNetwork replaces the
// lists, IPv6 entries work as IPv4 ones do, and allowPublicTraffic false
// keeps the ports private. Needs E2B_* and PEER_A, PEER_B (http://host:port
// of two outside test servers answering "outside"), PEER_A6, PEER_B6 (the
// same servers' IPv6 addresses) and PEER_PORT.
import assert from 'node:assert/strict'
import http from 'node:http'
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

  // IPv6: the sandbox reaches the servers' IPv6 addresses, and IPv6
  // entries allow and deny them as IPv4 entries do.
  const a6 = `http://[${process.env.PEER_A6}]:${process.env.PEER_PORT}`
  const b6 = `http://[${process.env.PEER_B6}]:${process.env.PEER_PORT}`
  assert.equal(await reach(sbx, a6), 'outside', 'IPv6, lists empty')
  await sbx.updateNetwork({ denyOut: ['::/0'], allowOut: [process.env.PEER_A6] })
  assert.equal(await reach(sbx, a6), 'outside', 'the allowed IPv6 address (allow wins over deny ::/0)')
  assert.equal(await reach(sbx, b6), 'blocked', 'an IPv6 address only denyOut covers')
  assert.equal(await reach(sbx, b), 'outside', 'IPv4 untouched by IPv6 entries')
  await sbx.updateNetwork({ denyOut: [`${process.env.PEER_B6}/128`] })
  assert.equal(await reach(sbx, a6), 'outside')
  assert.equal(await reach(sbx, b6), 'blocked', 'denied by an IPv6 CIDR')
  console.log('ok 5 - IPv6: reached, allowed and denied by IPv6 entries')
} finally {
  await sbx.kill()
}

// allowPublicTraffic: false keeps the sandbox's ports for holders of its
// traffic access token (the SDK's sbx.trafficAccessToken).
const priv = await Sandbox.create({ network: { allowPublicTraffic: false } })
try {
  assert.ok(priv.trafficAccessToken, 'a traffic access token')
  await priv.commands.run('cd /tmp && echo private-port > index.html && python3 -m http.server 8000', { background: true })
  const port = async (token) => {
    const headers = { 'E2b-Sandbox-Id': priv.sandboxId, 'E2b-Sandbox-Port': '8000' }
    if (token) headers['E2B-Traffic-Access-Token'] = token
    const res = await fetch(process.env.E2B_SANDBOX_URL + '/index.html', { headers })
    return `${res.status} ${(await res.text()).trim()}`
  }
  let got
  for (let i = 0; i < 100; i++) { // the server starts
    got = await port(priv.trafficAccessToken)
    if (got.startsWith('200')) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(got, '200 private-port', 'with the traffic token')
  // With `spore up --domain spore.localhost` the SDK's getHost names the
  // sandbox's port the way the proxy routes it by Host.
  assert.equal(priv.getHost(8000), `8000-${priv.sandboxId}.spore.localhost`)
  const byHost = await new Promise((resolve, reject) => {
    const u = new URL(process.env.E2B_SANDBOX_URL)
    http.get({ host: u.hostname, port: u.port, path: '/index.html',
      headers: { Host: priv.getHost(8000), 'E2B-Traffic-Access-Token': priv.trafficAccessToken } }, (res) => {
      let body = ''
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve(`${res.statusCode} ${body.trim()}`))
    }).on('error', reject)
  })
  assert.equal(byHost, '200 private-port', 'by the Host getHost names')
  assert.match(await port(''), /^403 /, 'without it')
  assert.match(await port('tt_not-the-token'), /^403 /, 'with a wrong one')
  console.log('ok 6 - allowPublicTraffic false: ports need the traffic access token; getHost names the port by --domain')
} finally {
  await priv.kill()
}
// lifecycle autoResume: traffic resumes a paused sandbox, its server
// still running (memory kept).
const auto = await Sandbox.create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
try {
  await auto.commands.run('cd /tmp && echo resumed-by-traffic > index.html && python3 -m http.server 8001', { background: true })
  const get = async () => {
    const res = await fetch(process.env.E2B_SANDBOX_URL + '/index.html', { headers: { 'E2b-Sandbox-Id': auto.sandboxId, 'E2b-Sandbox-Port': '8001' } })
    return `${res.status} ${(await res.text()).trim()}`
  }
  let got
  for (let i = 0; i < 100 && !(got = await get()).startsWith('200'); i++) await new Promise((r) => setTimeout(r, 100))
  assert.equal(got, '200 resumed-by-traffic')
  assert.equal(await auto.pause(), true)
  assert.equal((await Sandbox.getInfo(auto.sandboxId)).state, 'paused')
  assert.equal(await get(), '200 resumed-by-traffic', 'traffic to the paused sandbox')
  assert.equal((await Sandbox.getInfo(auto.sandboxId)).state, 'running')
  console.log('ok 7 - autoResume: traffic resumes a paused sandbox, its server still up')
} finally {
  await auto.kill()
}
console.log('7 passed, 0 failed')
