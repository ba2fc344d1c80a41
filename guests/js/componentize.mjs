// Builds one JavaScript guest into a component with the componentize-js API (the jco
// CLI's `componentize` fails on a local WIT directory):
//
//   node componentize.mjs SOURCE.js OUT.wasm PROVISIONER_WIT_DIR
//
// The WIT given to componentize-js is assembled in a temporary directory: `world.wit`
// beside this script (the world `provisioner-js`), the host's contract from
// PROVISIONER_WIT_DIR as a dependency, and the WASI 0.2.12 packages it uses, taken from
// the jco package installed by `npm ci` (so they match the pinned toolchain).
import { componentize } from '@bytecodealliance/componentize-js';
import { cpSync, mkdtempSync, mkdirSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const [source, out, pluginWit] = process.argv.slice(2);
if (!source || !out || !pluginWit) {
  console.error('usage: node componentize.mjs SOURCE.js OUT.wasm PROVISIONER_WIT_DIR');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
// jco is a dependency of componentize-js; its package exports no file paths.
const jcoWit = join(here, 'node_modules/@bytecodealliance/jco/lib/wit/builtin/0.2.12');

const wit = mkdtempSync(join(tmpdir(), 'wasm-provisioner-js-wit-'));
try {
  cpSync(join(here, 'world.wit'), join(wit, 'world.wit'));
  mkdirSync(join(wit, 'deps'));
  cpSync(resolve(pluginWit), join(wit, 'deps/plugin'), { recursive: true });
  for (const pkg of ['wasi-filesystem', 'wasi-io', 'wasi-clocks']) {
    cpSync(join(jcoWit, pkg), join(wit, 'deps', pkg), { recursive: true });
  }
  const { component } = await componentize({
    sourcePath: resolve(source),
    witPath: wit,
    worldName: 'provisioner-js',
    // A provisioner needs none of these; without them the component imports less.
    disableFeatures: ['http', 'fetch-event'],
  });
  const tmp = `${out}.${process.pid}.tmp`;
  writeFileSync(tmp, component);
  renameSync(tmp, out);
} finally {
  rmSync(wit, { recursive: true, force: true });
}
