// Unit tests of the JavaScript SDK's pure helpers, in Node (no componentize-js):
//
//   node --test guests/js/sdk/test/
//
// The host's interfaces the SDK imports (`wasm-provisioner:*`, `wasi:*`) exist only in
// the component; they are stubbed here. The quantity cases are the Rust SDK's and the
// host's (`guests/sdk/src/quantity.rs`, `host/rules/src/quantity.rs`): all read a size
// the same way.
import { register } from 'node:module';
import { test } from 'node:test';
import assert from 'node:assert/strict';

register('data:text/javascript,' + encodeURIComponent(`
export async function resolve(specifier, context, next) {
  if (/^(wasm-provisioner|wasi):/.test(specifier)) return { url: 'stub:' + specifier, shortCircuit: true };
  return next(specifier, context);
}
export async function load(url, context, next) {
  if (!url.startsWith('stub:')) return next(url, context);
  const stub = '() => { throw new Error("a stub"); }';
  return { format: 'module', shortCircuit: true,
    source: 'export const log = ' + stub + '; export const statFilesystem = ' + stub +
      '; export const getDirectories = ' + stub + ';' };
}`));
const sdk = await import('../wasm-provisioner-sdk.js');

test('quantities are read as Kubernetes reads them', () => {
  const cases = {
    '0': 0n, '1': 1n, '+1': 1n, '007': 7n, '18446744073709551615': 18446744073709551615n,
    '1Ki': 1024n, '10Gi': 10n << 30n, '15Ei': 15n << 60n, '1.5Gi': 1610612736n,
    '1.1Gi': 1181116007n, '1k': 1000n, '500M': 500000000n, '2.5G': 2500000000n,
    '18E': 18n * 10n ** 18n, '100m': 1n, '1000m': 1n, '1001m': 2n, '1u': 1n, '1n': 1n,
    '0m': 0n, '1.1': 2n, '0.5': 1n, '.5': 1n, '2.': 2n, '1e3': 1000n, '1E3': 1000n,
    '1e+3': 1000n, '1.5e3': 1500n, '12e-1': 2n, '1e-3': 1n, '1e0': 1n, '1e-100': 1n,
    '0e100': 0n, '1e18': 10n ** 18n, '-0': 0n, '0.000': 0n, '0Gi': 0n,
    '0.000000000000000000000000000000000000000000001Ei': 1n,
    [`1${'0'.repeat(21)}m`]: 10n ** 18n, [`0.${'0'.repeat(40)}1Ei`]: 1n,
  };
  for (const [text, size] of Object.entries(cases)) assert.equal(sdk.parseQuantity(text), size, text);
});

test('what is not a size is refused, naming the text', () => {
  for (const text of ['-1', '-1Gi', '-0.5', '-1e3', '18446744073709551616', '16Ei', '19E',
    '1e20', '1e999999', '99999999999999999999999999999999999999Ei', '', ' ', ' 1Gi', '1Gi ',
    'Gi', '1 Gi', '1KB', '1K', '1gi', '1GiB', '1.2.3', '.', '+', '-', '1e', '1e1.5', '1ee3',
    'e3', '1i', '0x10', '1,5Gi', '1Gi1', '--1', '1e1234567']) {
    assert.throws(() => sdk.parseQuantity(text), (e) => e.message.includes(JSON.stringify(text)), text);
  }
});

test('Params.quantity and the delete budget', () => {
  const params = new sdk.Params([['maxSize', '1.5Gi'], ['bad', '10GB'], ['empty', '']]);
  assert.equal(params.quantity('maxSize'), 3n << 29n);
  assert.equal(params.quantity('empty', '1Gi'), 1n << 30n);
  assert.throws(() => params.quantity('bad'), (e) => e instanceof sdk.ParamError && /`bad`.*10GB/.test(e.message));
  assert.equal(sdk.formatBytes(3n << 29n), '1536Mi');
  assert.equal(sdk.deleteBudget(new sdk.Params([])), sdk.DEFAULT_DELETE_CHUNK);
  assert.equal(sdk.deleteBudget(new sdk.Params([['deleteChunkEntries', '5']])), 5);
  for (const bad of ['0', 'x', '20000000', '-1', '1.5']) {
    assert.throws(() => sdk.deleteBudget(new sdk.Params([['deleteChunkEntries', bad]])), /deleteChunkEntries/);
  }
});
