// A named snapshot outlives its sandbox: kill the sandbox, start a new one
// from the snapshot later, and carry on with the same files and memory.
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=... node snapshot-outlives.mjs
import { Sandbox } from '@e2b/code-interpreter'

const name = `trained-${process.pid}`
const sbx = await Sandbox.create()
await sbx.runCode('weights = [0.1, 0.2, 0.3]\nepochs = 3')
await sbx.files.write('/home/user/notes.md', '# run 1\nloss went down')
await sbx.createSnapshot({ name })
await sbx.kill()
console.log('sandbox killed; snapshot', name, 'kept')

// Later: a fresh sandbox from the snapshot's name.
const again = await Sandbox.create(name)
const epochs = (await again.runCode('epochs += 1\nepochs')).text
const notes = await again.files.read('/home/user/notes.md')
console.log('restored:', { epochs, notes })
if (epochs !== '4' || !notes.includes('loss went down')) throw new Error('state not restored')
await again.kill()
const snaps = await Sandbox.listSnapshots({ name }).nextItems()
for (const s of snaps) await Sandbox.deleteSnapshot(s.snapshotId)
console.log('ok')
