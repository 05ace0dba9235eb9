// E2B's template builder through the stock SDK, unchanged: Template()
// from an image in a local registry (IMAGE) with copy, run, env, workdir,
// user, start and ready steps, built by Template.build; sandboxes from it
// have the files, the env and the started process; a rebuild is all
// cache hits; a changed step reruns from there; a failing step reports
// itself; Template.exists; tags; a Dockerfile (fromDockerfile).
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, waitForFile } from 'e2b'

const image = process.env.IMAGE
const ctxDir = fs.mkdtempSync(path.join(os.tmpdir(), 'spore-tpl-'))
fs.mkdirSync(path.join(ctxDir, 'bin'))
// The image is busybox without bash, which the SDK's commands.run uses:
// the template adds one (a step like any other).
fs.writeFileSync(path.join(ctxDir, 'bin', 'bash'), '#!/bin/sh\nexec /bin/sh "$@"\n')
fs.mkdirSync(path.join(ctxDir, 'app', 'sub'), { recursive: true })
fs.writeFileSync(path.join(ctxDir, 'app', 'hello.txt'), 'hello from copy\n')
fs.writeFileSync(path.join(ctxDir, 'app', 'sub', 'deep.txt'), 'deep\n')

let passed = 0
const ok = (msg) => { passed++; console.log(`ok ${passed} - ${msg}`) }

const recipe = (runText) => Template({ fileContextPath: ctxDir })
  .fromImage(image)
  .copy('bin/bash', '/bin/bash', { user: 'root', mode: 0o755 })
  .copy('app', '/srv/app/', { user: 'app' })
  .runCmd(`echo "${runText} as $(id -un) in $(pwd)" > /srv/work/built.txt`)
  .setEnvs({ STAGE: 'test', GREETING2: '$GREETING too' })
  .setWorkdir('/srv/app')
  .runCmd('id -un > made-by.txt', { user: 'root' })
  .setUser('root')
  .setStartCmd('echo "$STAGE" > /tmp/started; exec sleep 100000', waitForFile('/tmp/started'))

const build = async (tpl, name) => {
  const logs = []
  await Template.build(tpl, name, { onBuildLogs: (l) => logs.push(String(l.message ?? l)) })
  return logs
}

const run = async (sbx, cmd) => (await sbx.commands.run(cmd)).stdout.trim()

assert.equal(await Template.exists('sdk-app'), false, 'exists before the build')
assert.equal(await Template.exists('base'), true, 'the built-in template exists')
const first = await build(recipe('built'), 'sdk-app')
assert.ok(first.some((l) => l.includes('[1/7]')), 'the first build runs its steps: ' + first.join('\n'))
assert.equal(await Template.exists('sdk-app'), true, 'exists after the build')
ok('Template.build from an image; Template.exists false then true')

const sbx = await Sandbox.create('sdk-app')
try {
  assert.equal(await sbx.files.read('/srv/app/hello.txt'), 'hello from copy\n')
  assert.equal(await sbx.files.read('/srv/app/sub/deep.txt'), 'deep\n')
  assert.equal(await run(sbx, 'stat -c %U /srv/app/hello.txt'), 'app', 'copy with user')
  assert.equal(await run(sbx, 'stat -c %a /bin/bash'), '755', 'copy with mode')
  assert.equal(await sbx.files.read('/srv/work/built.txt'), 'built as app in /srv/work\n', 'run as the image user in its workdir')
  assert.equal(await sbx.files.read('/srv/app/made-by.txt'), 'root\n', 'run as root in the new workdir')
  assert.equal(await run(sbx, 'echo "$STAGE|$GREETING2|$GREETING"'), 'test|hello from the image too|hello from the image', 'env')
  assert.equal(await run(sbx, 'pwd; id -un'), '/srv/app\nroot', 'workdir and user')
  assert.equal(await sbx.files.read('/tmp/started'), 'test\n', 'the start command ran')
  const procs = await sbx.commands.list()
  assert.ok(procs.some((p) => JSON.stringify(p).includes('sleep 100000')), 'the start command is running: ' + JSON.stringify(procs))
} finally {
  await sbx.kill()
}
ok('a sandbox of it has the files, owners, modes, env, workdir, user and the running start command')

const again = await build(recipe('built'), 'sdk-app')
assert.ok(!again.some((l) => /\[\d+\/7\]/.test(l) && !l.includes('CACHED')), 'a rebuild runs nothing: ' + again.join('\n'))
assert.ok(again.some((l) => l.includes('CACHED start and ready')), 'a rebuild is a cache hit: ' + again.join('\n'))
ok('a rebuild is all cache hits')

const changed = await build(recipe('rebuilt'), 'sdk-app:v2')
const ran = changed.filter((l) => /\[\d+\/7\]/.test(l) && !l.includes('CACHED')).map((l) => l.match(/\[(\d+)\/7\]/)[1])
assert.deepEqual(ran, ['3', '4', '5', '6', '7'], 'a changed step 3 reruns from there: ' + changed.join('\n'))
const v2 = await Sandbox.create('sdk-app:v2')
try {
  assert.equal(await v2.files.read('/srv/work/built.txt'), 'rebuilt as app in /srv/work\n')
} finally {
  await v2.kill()
}
ok('a changed step reruns from that step; name:tag creates from that build')

const tags = (await Template.getTags('sdk-app')).map((t) => t.tag).sort()
assert.deepEqual(tags, ['default', 'v2'])
await Template.assignTags('sdk-app:v2', 'prod')
assert.deepEqual((await Template.getTags('sdk-app')).map((t) => t.tag).sort(), ['default', 'prod', 'v2'])
const byTag = Object.fromEntries((await Template.getTags('sdk-app')).map((t) => [t.tag, t.buildId]))
assert.equal(byTag.prod, byTag.v2, 'prod names the v2 build')
assert.notEqual(byTag.default, byTag.v2)
const old = await Sandbox.create('sdk-app:default')
try {
  assert.equal(await old.files.read('/srv/work/built.txt'), 'built as app in /srv/work\n', 'the default tag keeps its build')
} finally {
  await old.kill()
}
await Template.removeTags('sdk-app', 'prod')
assert.deepEqual((await Template.getTags('sdk-app')).map((t) => t.tag).sort(), ['default', 'v2'])
await assert.rejects(Template.removeTags('sdk-app', 'nope'), 'removing a tag that is not there')
ok('tags: listed, assigned, removed; each names its build')

const failing = Template().fromImage(image).runCmd('echo first-ok').runCmd('echo about to fail; exit 3')
await assert.rejects(build(failing, 'sdk-fail'), (err) => {
  assert.equal(err.name, 'BuildError')
  assert.match(err.message, /step 2 .*exited 3/)
  return true
})
assert.equal(await Template.exists('sdk-fail'), false, 'a failed build makes no template')
await assert.rejects(build(Template().fromImage(image.replace(/:[^:/]+$/, ':no-such-tag')), 'sdk-missing'), /not found|NotFound|unknown/i)
ok('a failing step reports its step and message; an unknown image fails the build')

const df = Template({ fileContextPath: ctxDir }).fromDockerfile(
  `FROM ${image}\nCOPY app /srv/df/\nENV DF=dockerfile\nRUN echo "$DF" > /srv/work/df.txt\nWORKDIR /srv/df\n`)
await build(df, 'sdk-df')
const d = await Sandbox.create('sdk-df')
try {
  assert.equal(await d.files.read('/srv/df/hello.txt'), 'hello from copy\n')
  assert.equal(await d.files.read('/srv/work/df.txt'), 'dockerfile\n')
} finally {
  await d.kill()
}
ok('a Dockerfile through fromDockerfile')

// On another template, and on a snapshot of a sandbox (its files and
// the running start command come along).
await build(Template().fromTemplate('sdk-df').runCmd('echo layered > /srv/work/layered.txt', { user: 'root' }), 'sdk-layered')
const src = await Sandbox.create('sdk-app')
let snapshotId
try {
  await src.files.write('/srv/work/from-snapshot.txt', 'kept\n')
  snapshotId = (await src.createSnapshot()).snapshotId
} finally {
  await src.kill()
}
await build(Template().fromTemplate(snapshotId).runCmd('cat /srv/work/from-snapshot.txt > /srv/work/copied.txt'), 'sdk-from-snap')
const l = await Sandbox.create('sdk-layered')
const f = await Sandbox.create('sdk-from-snap')
try {
  assert.equal(await l.files.read('/srv/df/hello.txt'), 'hello from copy\n', 'the base template\'s files')
  assert.equal(await l.files.read('/srv/work/layered.txt'), 'layered\n')
  assert.equal(await f.files.read('/srv/work/copied.txt'), 'kept\n', 'the snapshot\'s file')
  assert.equal(await f.files.read('/tmp/started'), 'test\n', 'the snapshot\'s start command output')
} finally {
  await l.kill()
  await f.kill()
}
ok('from another template and from a snapshot')

// In the background: the status and its logs are polled while it builds.
const bg = await Template.buildInBackground(Template().fromTemplate('sdk-df').runCmd('echo step-one; sleep 2; echo step-two', { user: 'root' }), 'sdk-bg')
let status
let offset = 0
const seen = []
let logsWhileBuilding = 0
for (let i = 0; i < 600; i++) {
  status = await Template.getBuildStatus({ templateId: bg.templateId, buildId: bg.buildId }, { logsOffset: offset })
  offset += status.logEntries.length
  seen.push(...status.logEntries.map((e) => e.message))
  if (status.status === 'building') logsWhileBuilding += status.logEntries.length
  if (status.status === 'ready' || status.status === 'error') break
  await new Promise((r) => setTimeout(r, 100))
}
assert.equal(status.status, 'ready', seen.join('\n'))
assert.ok(logsWhileBuilding > 0, 'log entries arrive while the build runs')
assert.ok(seen.includes('step-one') && seen.includes('step-two'), 'the command\'s output is in the log: ' + seen.join('\n'))
assert.equal(new Set(seen).size > 3, true)
ok('buildInBackground and getBuildStatus with logsOffset')

console.log(`${passed} passed, 0 failed`)
