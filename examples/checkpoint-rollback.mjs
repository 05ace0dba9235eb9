// Checkpoint before a risky step; when it breaks things, roll back in place.
// The sandbox keeps its ID; files and memory (a Python variable) come back.
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=... node checkpoint-rollback.mjs
import { Sandbox } from '@e2b/code-interpreter'

const api = process.env.E2B_API_URL
const headers = { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' }

const sbx = await Sandbox.create()
await sbx.runCode('progress = ["cloned repo", "installed deps"]')
await sbx.files.write('/home/user/app/config.json', '{"debug": false}')

// Checkpoint: a live snapshot, the sandbox keeps running.
const { snapshotId } = await sbx.createSnapshot()
console.log('checkpoint', snapshotId)

// The agent's next step goes wrong.
await sbx.runCode('progress.append("ran a bad migration")')
await sbx.commands.run('rm -rf /home/user/app')

// Roll back in place (Spore's REST extension): same sandbox ID.
const res = await fetch(`${api}/sandboxes/${sbx.sandboxId}/rollback`, {
  method: 'POST', headers, body: JSON.stringify({ snapshotID: snapshotId }),
})
if (!res.ok) throw new Error(`rollback: ${res.status} ${await res.text()}`)

const same = await Sandbox.connect(sbx.sandboxId)
const progress = (await same.runCode('progress')).text
const config = await same.files.read('/home/user/app/config.json')
console.log('after rollback:', progress, config)
if (!progress.includes('installed deps') || progress.includes('bad migration') || !config.includes('debug')) {
  throw new Error('rollback did not restore the state')
}
await same.kill()
await fetch(`${api}/templates/${snapshotId}`, { method: 'DELETE', headers })
console.log('ok')
