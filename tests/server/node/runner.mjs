// The tiny test runner the SDK scripts share: test(name, fn) registers, run(suite)
// runs them in order, prints one line per test and "N passed, M failed", and
// exits with status 1 on any failure.
const tests = [];
export const test = (name, fn) => tests.push({ name, fn });

export async function run(suite) {
  let passed = 0, failed = 0;
  for (const t of tests) {
    const t0 = Date.now();
    try {
      await t.fn();
      passed++;
      console.log(`PASS ${t.name} (${((Date.now() - t0) / 1000).toFixed(2)} s)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}: ${e?.stack ?? e}`);
    }
  }
  console.log(`${suite}: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}
