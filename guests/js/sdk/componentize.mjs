#!/usr/bin/env node
// Builds one JavaScript guest into a component with the componentize-js API (the jco
// CLI's `componentize` fails on a local WIT directory). Part of the SDK package
// (`wasm-provisioner-sdk` on npm, the bin `wasm-provisioner-componentize`):
//
//   node node_modules/wasm-provisioner-sdk/componentize.mjs SOURCE.js OUT.wasm PROVISIONER_WIT_DIR
//
// The app imports the SDK by its package name (`import * as sdk from
// 'wasm-provisioner-sdk'`); it is always the SDK beside this script, so the SDK and its
// build move together.
//
// 1. Which capabilities: SOURCE.js is loaded once in Node, its imports of the host's
//    interfaces (`wasm-provisioner:*`, `wasi:*`) replaced by stubs (never called while
//    a module loads). The SDK's `exportPlugin` returns an interface object for each
//    capability whose method the plugin implements; the ones SOURCE.js exports defined
//    (among `expander`, `capacityReporter`, `classValidator`) are its capabilities.
// 2. The WIT given to componentize-js is assembled in a temporary directory:
//    `world.wit` beside this script (the world `plugin-js`), a generated world `guest`
//    (`include plugin-js;` plus one `export` per capability), the host's contract from
//    PROVISIONER_WIT_DIR as a dependency, and the WASI 0.2.12 packages it uses, taken
//    from the jco package installed with componentize-js (so they match the pinned
//    toolchain).
// 3. The engine resolves only relative imports, inside the app's directory: the app's
//    directory (without node_modules, dist and dot entries) is copied to a temporary
//    directory with the SDK beside it as `__wasm_provisioner_sdk.js`, and the imports
//    of `wasm-provisioner-sdk` are rewritten to it. An app's own modules must be in its
//    directory.
import { componentize } from '@bytecodealliance/componentize-js';
import { cpSync, existsSync, mkdtempSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { register } from 'node:module';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [source, out, pluginWit] = process.argv.slice(2);
if (!source || !out || !pluginWit) {
  console.error('usage: node componentize.mjs SOURCE.js OUT.wasm PROVISIONER_WIT_DIR');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const SDK_NAME = 'wasm-provisioner-sdk';
const sdkFile = join(here, 'wasm-provisioner-sdk.js');

// jco is a dependency of componentize-js; its package exports no file paths, so it is
// looked for in the node_modules directories Node would search from here.
function findJcoWit() {
  const wanted = join('@bytecodealliance', 'jco', 'lib', 'wit', 'builtin', '0.2.12');
  for (let dir = here; ; dir = dirname(dir)) {
    const candidate = join(dir, 'node_modules', wanted);
    if (existsSync(candidate)) return candidate;
    if (dirname(dir) === dir) break;
  }
  console.error(`componentize.mjs: no node_modules/${wanted} above ${here}: install the pinned ` +
    '@bytecodealliance/componentize-js beside wasm-provisioner-sdk (npm ci)');
  process.exit(1);
}
const jcoWit = findJcoWit();

/** Optional capability exports of the app: the JS export name and the WIT interface. */
const OPTIONAL = [
  ['expander', 'expander'],
  ['capacityReporter', 'capacity-reporter'],
  ['classValidator', 'class-validator'],
];

// Stubs for the component imports, so that Node can load the app: each stub module
// exports the names its importer asks for (read from the importer's import statements).
const hooks = String.raw`
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
export async function resolve(specifier, context, next) {
  if (specifier === ${JSON.stringify(SDK_NAME)}) {
    return { url: ${JSON.stringify(pathToFileURL(sdkFile).href)}, shortCircuit: true };
  }
  if (/^(wasm-provisioner|wasi):/.test(specifier)) {
    const parent = encodeURIComponent(context.parentURL || '');
    return { url: 'stub:' + encodeURIComponent(specifier) + '?' + parent, shortCircuit: true };
  }
  return next(specifier, context);
}
export async function load(url, context, next) {
  if (!url.startsWith('stub:')) return next(url, context);
  const [specifier, parent] = url.slice(5).split('?').map(decodeURIComponent);
  const names = new Set();
  if (parent.startsWith('file:')) {
    const text = readFileSync(fileURLToPath(parent), 'utf8');
    for (const m of text.matchAll(/import\s*\{([^}]*)\}\s*from\s*['"]([^'"]+)['"]/g)) {
      if (m[2] !== specifier) continue;
      for (const part of m[1].split(',')) {
        const name = part.trim().split(/\s+as\s+/)[0].trim();
        if (name) names.add(name);
      }
    }
  }
  const body = [...names].map((n) => 'export const ' + n + ' = () => { throw new Error("a stub"); };');
  return { format: 'module', source: body.join('\n') + '\nexport default {};\n', shortCircuit: true };
}
`;
register('data:text/javascript,' + encodeURIComponent(hooks));
let app;
try {
  app = await import(pathToFileURL(resolve(source)).href);
} catch (e) {
  console.error(`componentize.mjs: loading ${source} in Node (to find its capabilities) failed: ${e && e.stack || e}`);
  process.exit(1);
}
if (!app.provisioner) {
  console.error(`componentize.mjs: ${source} exports no \`provisioner\`: end it with\n` +
    '  export const { provisioner, expander, capacityReporter, classValidator } = sdk.exportPlugin(new MyPlugin());');
  process.exit(1);
}
const exported = OPTIONAL.filter(([name]) => app[name] !== undefined);
const guestWorld = [
  'package wasm-provisioner:js-guest;',
  '',
  '/// Generated by componentize.mjs: the capabilities the plugin implements.',
  'world guest {',
  '    include plugin-js;',
  ...exported.map(([, iface]) => `    export wasm-provisioner:plugin/${iface}@0.2.0;`),
  '}',
  '',
].join('\n');
console.error(`componentize.mjs: ${source}: capabilities: ${exported.map(([, i]) => i).join(', ') || 'none'}`);

// Step 3: the app's directory with the SDK inside it, its imports of the SDK relative.
const stageDir = mkdtempSync(join(tmpdir(), 'wasm-provisioner-js-src-'));
const SDK_IMPORT = new RegExp(`((?:from|import)\\s*\\(?\\s*)(['"])${SDK_NAME}\\2`, 'g');
function stage(sourceFile) {
  const appDir = dirname(sourceFile);
  const skip = new Set(['node_modules', 'dist']);
  const copy = (from, to) => {
    mkdirSync(to, { recursive: true });
    for (const entry of readdirSync(from, { withFileTypes: true })) {
      if (entry.name.startsWith('.') || skip.has(entry.name)) continue;
      const src = join(from, entry.name);
      const dst = join(to, entry.name);
      if (entry.isDirectory()) {
        copy(src, dst);
      } else if (entry.isFile() && /\.m?js$/.test(entry.name)) {
        const up = relative(dirname(dst), join(stageDir, '__wasm_provisioner_sdk.js')).split(sep).join('/');
        const spec = up.startsWith('.') ? up : `./${up}`;
        writeFileSync(dst, readFileSync(src, 'utf8').replace(SDK_IMPORT, `$1$2${spec}$2`));
      }
    }
  };
  copy(appDir, stageDir);
  cpSync(sdkFile, join(stageDir, '__wasm_provisioner_sdk.js'));
  return join(stageDir, basename(sourceFile));
}

const wit = mkdtempSync(join(tmpdir(), 'wasm-provisioner-js-wit-'));
try {
  cpSync(join(here, 'world.wit'), join(wit, 'world.wit'));
  writeFileSync(join(wit, 'guest.wit'), guestWorld);
  mkdirSync(join(wit, 'deps'));
  cpSync(resolve(pluginWit), join(wit, 'deps/plugin'), { recursive: true });
  for (const pkg of ['wasi-filesystem', 'wasi-io', 'wasi-clocks']) {
    cpSync(join(jcoWit, pkg), join(wit, 'deps', pkg), { recursive: true });
  }
  const staged = stage(resolve(source));
  const { component } = await componentize({
    sourcePath: staged,
    witPath: wit,
    worldName: 'guest',
    // A provisioner needs none of these; without them the component imports less.
    disableFeatures: ['http', 'fetch-event'],
  });
  const tmp = `${out}.${process.pid}.tmp`;
  writeFileSync(tmp, component);
  renameSync(tmp, out);
} finally {
  rmSync(wit, { recursive: true, force: true });
  rmSync(stageDir, { recursive: true, force: true });
}
