// Runs one command in an existing sandbox through the stock E2B SDK
// (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY name the replica) and prints
// its stdout after "OUT:". Usage: node run.mjs SANDBOX_ID 'command'
const { Sandbox } = await import('e2b')
const [id, cmd] = process.argv.slice(2)
const sb = await Sandbox.connect(id)
const r = await sb.commands.run(cmd, { timeoutMs: 120000 })
console.log('OUT:' + r.stdout.trim())
