// The web console in a real headless Chromium (Debian's, driven by
// playwright-core) against spore up, with the stock SDK making the changes
// the console should see (run by console_test.go). SCREENSHOTS=DIR saves
// the main pages there (docs/console.md's pictures).
import { chromium } from "playwright-core";
import { Sandbox } from "e2b";

const base = process.env.E2B_API_URL;
const key = process.env.E2B_API_KEY;
const shots = process.env.SCREENSHOTS || "";
let passed = 0;
function check(cond, what) {
  if (!cond) throw new Error(`console: ${what}`);
  passed++;
}
async function api(method, path, body) {
  const r = await fetch(base + path, { method, headers: { "X-API-KEY": key, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body) });
  const t = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${t}`);
  return t ? JSON.parse(t) : null;
}
async function eventually(what, fn, ms = 60000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try { if (await fn()) return; } catch (e) { last = e; }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`console: ${what} not within ${ms / 1000} s${last ? `: ${last.message}` : ""}`);
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
let sbx;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(60000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  const shot = async (name, p = page) => { if (shots) await p.screenshot({ path: `${shots}/${name}.png`, fullPage: true }); };

  // Sign in: a wrong key is refused with a message; the right one opens
  // the list, and never shows up in the address.
  await page.goto(base + "/");
  await page.fill("#apikey", "not-the-key");
  await page.click("#signin");
  await page.waitForSelector("#error:not([hidden])");
  check((await page.textContent("#error")).includes("not valid"), "a wrong key's message");
  await page.fill("#apikey", key);
  await shot("signin");
  await page.click("#signin");
  await page.waitForSelector("#sandboxes");
  check(!page.url().includes(key), "the key is not in the address");

  // A sandbox made elsewhere appears by itself (the list is live).
  sbx = await Sandbox.create("base", { metadata: { suite: "console" } });
  const id = sbx.sandboxId;
  await page.waitForSelector(`tr[data-id="${id}"]`);
  check(true, "a new sandbox appears in the list");
  await shot("sandboxes");

  // Its page: two snapshots around a change.
  await page.click(`a[href="#/sandboxes/${id}"]`);
  await page.waitForSelector("#do-snapshot");
  await sbx.commands.run("echo one > /home/user/notes.txt");
  await page.click("#do-snapshot");
  const first = await (await page.waitForSelector("#snapshots tbody tr[data-id]")).getAttribute("data-id");
  await sbx.commands.run("echo two > /home/user/notes.txt; echo later > /home/user/after.txt");
  await page.click("#do-snapshot");
  const second = await (await page.waitForSelector(`#snapshots tbody tr[data-id]:not([data-id="${first}"])`)).getAttribute("data-id");
  check(first !== second, "two snapshots listed");

  // Fork 2: the lineage shows both forks under the sandbox.
  await page.fill("#fork-n", "2");
  await page.click("#do-fork");
  await page.waitForFunction(() => [...document.querySelectorAll("#lineage .node-kind")].filter((e) => e.textContent === "fork").length === 2);
  check((await page.textContent("#lineage")).includes(first), "the lineage shows the snapshots");

  // The diff from the first snapshot to the second.
  await page.check(`tr[data-id="${first}"] input[name="from"]`);
  await page.check(`tr[data-id="${second}"] input[name="to"]`);
  await page.click("#do-diff");
  await page.waitForSelector("#diff-list");
  const diff = await page.textContent("#diff");
  check(diff.includes("M /home/user/notes.txt") && diff.includes("A /home/user/after.txt") && diff.includes("+two"), `the diff shows the changes: ${diff}`);
  await shot("sandbox");

  // Roll back to the first snapshot: the later file is gone (seen by the
  // SDK, same sandbox ID).
  await page.click(`tr[data-id="${first}"] button.rollback`);
  await eventually("the rollback", async () => {
    const r = await sbx.commands.run("test ! -e /home/user/after.txt && cat /home/user/notes.txt");
    return r.stdout.trim() === "one";
  });
  check(true, "the rollback took the sandbox back");

  // Its files: the list shows notes.txt (as rolled back), a download
  // gives its content, an upload lands in the sandbox.
  await page.goto(base + `/#/snapshots`);
  await page.goto(base + `/#/sandboxes/${id}`);
  await eventually("the file list", async () => {
    if (await page.$('#files tr[data-path="/home/user/notes.txt"]')) return true;
    throw new Error(`the page: ${(await page.evaluate(() => document.body.innerText)).slice(0, 2000)}`);
  });
  const [download] = await Promise.all([page.waitForEvent("download"),
    page.click('#files tr[data-path="/home/user/notes.txt"] button.download')]);
  const chunks = [];
  for await (const c of await download.createReadStream()) chunks.push(c);
  check(Buffer.concat(chunks).toString() === "one\n", `the downloaded file: ${JSON.stringify(Buffer.concat(chunks).toString())}`);
  await page.setInputFiles("#upload", { name: "up.txt", mimeType: "text/plain", buffer: Buffer.from("uploaded\n") });
  await page.waitForSelector('#files tr[data-path="/home/user/up.txt"]');
  check((await sbx.files.read("/home/user/up.txt")) === "uploaded\n", "the uploaded file is in the sandbox");

  // A terminal: a shell in a PTY of the sandbox, a command typed, its
  // output on the screen.
  await page.click("#open-terminal");
  await page.waitForSelector("#terminal .xterm-rows");
  await page.click("#terminal");
  await page.keyboard.type("echo $((6*7))spore");
  await page.keyboard.press("Enter");
  await eventually("the terminal's output", async () => {
    const screen = await page.textContent("#terminal .xterm-rows");
    if (screen.includes("42spore")) return true;
    throw new Error(`the screen: ${JSON.stringify(screen.trim())}; error: ${await page.textContent("#error")}`);
  });
  check(true, "a command typed in the terminal ran in the sandbox");
  await shot("terminal");

  // Bulk kill of the forks from the list.
  const kids = (await api("GET", "/v2/sandboxes")).filter((s) => s.sporeForkedFrom === id).map((s) => s.sandboxID);
  check(kids.length === 2, `2 forks recorded, got ${kids.length}`);
  await page.goto(base + "/#/sandboxes");
  for (const k of kids) await page.check(`tr[data-id="${k}"] input[type=checkbox]`);
  await page.click('button:has-text("Kill selected")');
  await eventually("the forks killed", async () => {
    const left = (await api("GET", "/v2/sandboxes")).map((s) => s.sandboxID);
    return kids.every((k) => !left.includes(k)) && left.includes(id);
  });
  await page.waitForFunction((ks) => ks.every((k) => !document.querySelector(`tr[data-id="${k}"]`)), kids);
  check(true, "bulk kill removed the forks and kept the sandbox");

  await page.goto(base + "/#/snapshots");
  await page.waitForSelector(`td:has-text("${second}")`);
  await shot("snapshots");

  // On a phone's screen.
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true });
  await phone.goto(base + "/");
  await phone.fill("#apikey", key);
  await phone.click("#signin");
  await phone.waitForSelector("#sandboxes", { timeout: 60000 });
  await phone.goto(base + `/#/sandboxes/${id}`);
  await phone.waitForSelector("#do-snapshot", { timeout: 60000 });
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `the sandbox page fits a phone's width (overflow ${overflow} px)`);
  await shot("phone-sandbox", phone);

  // Security headers; an unknown asset is a 404.
  const r = await fetch(base + "/");
  const csp = r.headers.get("content-security-policy") || "";
  check(csp.includes("script-src 'self'") && csp.includes("frame-ancestors 'none'"), `the page's CSP: ${csp}`);
  check((await fetch(base + "/console/nope.js")).status === 404, "an unknown asset is a 404");
  check(errors.length === 0, `no script errors: ${errors.join("; ")}`);
  console.log(`console: ${passed} passed`);
} finally {
  if (sbx) await sbx.kill().catch(() => {});
  await browser.close();
}
