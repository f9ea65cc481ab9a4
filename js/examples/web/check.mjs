// Opens the demo page in headless Chromium (Playwright, the system's browser) and prints what
// it generated, one JSON line per URL: node examples/web/check.mjs URL... [--chromium PATH]
// [--screenshot PNG] [--timeout SECONDS]. Each URL carries the page's query (mode, policy,
// prompt, max, run=1, ...); the URLs open one after another in one browser. With several URLs
// each page's screenshot is PNG with its number before the extension (page-1.png, ...).
import { chromium } from "playwright-core";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const urls = args.filter((a, i) => !a.startsWith("--") && !(i > 0 && args[i - 1].startsWith("--")));
const timeout = Number(option("timeout", "120")) * 1000;
const browser = await chromium.launch({
  executablePath: option("chromium", "/usr/bin/chromium"),
  // WebGPU is behind a flag on Linux; where no adapter comes, the page runs wasm and says why
  args: ["--enable-unsafe-webgpu", "--no-sandbox"],
});
try {
  for (const [i, url] of urls.entries()) {
    const shot = option("screenshot", null);
    const path = shot && urls.length > 1 ? shot.replace(/(\.png)?$/, `-${i + 1}.png`) : shot;
    console.log(JSON.stringify(await open(url, path)));
  }
} finally {
  await browser.close();
}

async function open(url, shot) {
  const started = performance.now();
  const page = await browser.newPage();
  const lines = [];
  page.on("console", (m) => lines.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => lines.push(`pageerror: ${e.message}`));
  await page.goto(url);
  try {
    await page.waitForFunction(() => window.edgespecResult !== undefined, null, { timeout });
  } catch {
    const status = await page.textContent("#status").catch(() => "?");
    return { error: `the page gave no result in ${timeout / 1000} s (status: ${status})`, console: lines };
  }
  const result = await page.evaluate(() => window.edgespecResult);
  result.status = await page.textContent("#status");
  result.backendLine = await page.textContent("#backend");
  result.crossOriginIsolated = await page.evaluate(() => crossOriginIsolated);
  result.console = lines;
  result.seconds = (performance.now() - started) / 1000;
  if (shot) await page.screenshot({ path: shot, fullPage: true });
  result.screenshot = shot;
  await page.close();
  return result;
}
