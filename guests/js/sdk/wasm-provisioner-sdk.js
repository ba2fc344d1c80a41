// Write wasm-provisioner plugins in JavaScript (componentize-js), contract 0.2
// (`wit/0.2.0/provisioner.wit`, world `wasm-provisioner:plugin/plugin@0.2.0`).
//
// The same shape as the Rust SDK (guests/sdk): a plugin is an object (or class instance)
// with `describe`, `provision`, `delete` and optionally `shouldProvision`,
// `shouldDelete`; `exportPlugin(plugin)` turns it into the component's exports, one
// object per exported interface:
//
//   import * as sdk from 'wasm-provisioner-sdk';
//   class Mine {
//     describe() { return sdk.pluginInfo('mine', '0.1.0'); }
//     provision(req) { ...; return sdk.volume(req.claim.requestedBytes, sdk.hostPath(p)); }
//     delete(req) { ... }                           // returns nothing or throws
//     // optional capabilities: implement any of
//     // expand(req) { return newSizeInBytes; }     // capability `expand`
//     // getCapacity(req) { return sdk.capacity(total, available); }  // `report-capacity`
//     // validateClass(cls) { ... }                 // `validate-class`: throw to refuse
//   }
//   export const { provisioner, expander, capacityReporter, classValidator } =
//     sdk.exportPlugin(new Mine());
//
// Capabilities: a plugin has exactly the optional capabilities whose method it
// implements (`expand`, `getCapacity`, `validateClass`). `exportPlugin` fills
// `describe`'s `capabilities` to match and returns the interface object of each one
// (the others are undefined); the build (`componentize.mjs`) loads the app once in
// Node with the host's imports stubbed, sees which of those exports the app defined,
// and builds the component for a world that exports exactly those interfaces. So the
// list in `describe`, the exports and the methods always agree.
//
// Answers other than a volume (or a successful delete, or a new size) are thrown: `new
// sdk.Infeasible(msg)`, `Failed`, `Ignored`, `InBackground`, `Reschedule`. A `ParamError`
// from the parameter helpers is `infeasible` in provision and expand, `failed` in delete,
// and the refusal's message in `validateClass` (throw any `Error` there to refuse the
// class; a `getCapacity` error is its message). Any other exception in provision, delete
// or expand is logged at error level and traps the call (like a Rust panic): the host
// reports it as `trap`.
//
// Types follow jco's mapping of the WIT: records are objects with camelCase fields,
// variants `{ tag, val }`, enums strings ('read-write-once'), options `undefined` or a
// value, string maps arrays of [key, value], and u64 (sizes in bytes) BigInt.
//
// Every call runs in a fresh instance: keep no state between calls. Every call may be
// repeated: be idempotent by PV name. Claims are hostile input.

import { log as hostLog } from 'wasm-provisioner:plugin/log@0.2.0';
import { statFilesystem as hostStatFilesystem } from 'wasm-provisioner:plugin/filesystem@0.2.0';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

// --- Logging over the `log` import -----------------------------------------------------

function emit(level, message, fields) {
  const pairs = Object.entries(fields || {}).map(([k, v]) => [String(k), String(v)]);
  hostLog(level, String(message), pairs);
}

export const log = {
  trace: (message, fields) => emit('trace', message, fields),
  debug: (message, fields) => emit('debug', message, fields),
  info: (message, fields) => emit('info', message, fields),
  warn: (message, fields) => emit('warn', message, fields),
  error: (message, fields) => emit('error', message, fields),
};

// --- Answers ---------------------------------------------------------------------------

export class Answer extends Error {
  constructor(tag, message) {
    super(message);
    this.tag = tag;
  }
}
export class Ignored extends Answer { constructor(m) { super('ignored', m); } }
export class Failed extends Answer { constructor(m) { super('failed', m); } }
export class InBackground extends Answer { constructor(m) { super('in-background', m); } }
export class Reschedule extends Answer { constructor(m) { super('reschedule', m); } }
export class Infeasible extends Answer { constructor(m) { super('infeasible', m); } }

/** A missing or malformed StorageClass parameter: the message names it and what to set. */
export class ParamError extends Error {}

const DELETE_TAGS = new Set(['ignored', 'failed', 'in-background']);

// componentize-js turns a thrown object with a `payload` into the `err` of a result.
function resultError(payload) {
  const error = new Error(payload.val);
  error.payload = payload;
  return error;
}

function trap(call, error) {
  log.error(`panic: ${call}: ${error && error.name}: ${error && error.message}`,
    { stack: (error && error.stack) || '' });
  return error;
}

/** The optional capabilities: the method a plugin implements, the interface it exports. */
export const CAPABILITIES = [
  { capability: 'expand', method: 'expand', exportName: 'expander', interface: 'expander' },
  { capability: 'report-capacity', method: 'getCapacity', exportName: 'capacityReporter', interface: 'capacity-reporter' },
  { capability: 'validate-class', method: 'validateClass', exportName: 'classValidator', interface: 'class-validator' },
];

/** The capabilities (`'expand'`, ...) `plugin` has: those whose method it implements. */
export function capabilitiesOf(plugin) {
  return CAPABILITIES.filter((c) => typeof plugin[c.method] === 'function').map((c) => c.capability);
}

const EXPAND_TAGS = new Set(['failed', 'in-background', 'infeasible']);

function message(e) {
  return e && typeof e.message === 'string' ? e.message : String(e);
}

/**
 * The component's exports, calling into `plugin`: `{ provisioner, expander,
 * capacityReporter, classValidator }`, each optional interface present only when the
 * plugin implements its method.
 */
export function exportPlugin(plugin) {
  const capabilities = capabilitiesOf(plugin);
  const provisioner = {
    describe() {
      let info;
      try { info = plugin.describe(); } catch (e) { throw trap('describe', e); }
      return { ...info, capabilities: [...capabilities] };
    },
    shouldProvision(request) {
      if (!plugin.shouldProvision) return true;
      try { return !!plugin.shouldProvision(request); } catch (e) { throw trap('should-provision', e); }
    },
    provision(request) {
      try {
        return plugin.provision(request);
      } catch (e) {
        if (e instanceof Answer) throw resultError({ tag: e.tag, val: e.message });
        if (e instanceof ParamError) throw resultError({ tag: 'infeasible', val: e.message });
        throw trap('provision', e);
      }
    },
    shouldDelete(request) {
      if (!plugin.shouldDelete) return true;
      try { return !!plugin.shouldDelete(request); } catch (e) { throw trap('should-delete', e); }
    },
    delete(request) {
      try {
        plugin.delete(request);
      } catch (e) {
        if (e instanceof Answer) {
          const tag = DELETE_TAGS.has(e.tag) ? e.tag : 'failed';
          throw resultError({ tag, val: e.message });
        }
        if (e instanceof ParamError) throw resultError({ tag: 'failed', val: e.message });
        throw trap('delete', e);
      }
    },
  };
  const exports = { provisioner, expander: undefined, capacityReporter: undefined, classValidator: undefined };
  if (capabilities.includes('expand')) {
    exports.expander = {
      expand(request) {
        try {
          return BigInt(plugin.expand(request));
        } catch (e) {
          if (e instanceof Answer) {
            const tag = EXPAND_TAGS.has(e.tag) ? e.tag : 'failed';
            throw resultError({ tag, val: e.message });
          }
          if (e instanceof ParamError) throw resultError({ tag: 'infeasible', val: e.message });
          throw trap('expand', e);
        }
      },
    };
  }
  if (capabilities.includes('report-capacity')) {
    exports.capacityReporter = {
      getCapacity(request) {
        let answer;
        try { answer = plugin.getCapacity(request); } catch (e) { throw stringError(message(e)); }
        return {
          totalBytes: BigInt(answer.totalBytes),
          availableBytes: BigInt(answer.availableBytes),
          maximumVolumeBytes: answer.maximumVolumeBytes === undefined ? undefined : BigInt(answer.maximumVolumeBytes),
        };
      },
    };
  }
  if (capabilities.includes('validate-class')) {
    exports.classValidator = {
      validateClass(cls) {
        try { plugin.validateClass(cls); } catch (e) { throw stringError(message(e)); }
      },
    };
  }
  return exports;
}

// A `result<_, string>` error: componentize-js takes the `payload` as the `err` value.
function stringError(text) {
  const error = new Error(text);
  error.payload = text;
  return error;
}

// --- Builders --------------------------------------------------------------------------

/** What `describe` answers; `exportPlugin` fills in `capabilities`. */
export function pluginInfo(name, version, { supportsBlock = false, dataSourceKinds = [] } = {}) {
  return { name, version, supportsBlock, dataSourceKinds, capabilities: [] };
}

/** A `getCapacity` answer; sizes are BigInts or numbers. */
export function capacity(totalBytes, availableBytes, maximumVolumeBytes) {
  return { totalBytes, availableBytes, maximumVolumeBytes };
}

/**
 * Usage of the filesystem holding `path`, a path inside a granted directory as the
 * plugin sees it (such as '/volumes'): `{ totalBytes, availableBytes }` (BigInts).
 * Throws `Failed` when the host cannot answer (outside every grant, ...).
 */
export function statFilesystem(path) {
  try { return hostStatFilesystem(path); } catch (e) {
    throw new Failed(`cannot stat the filesystem of ${path}: ${e && e.payload !== undefined ? e.payload : message(e)}`);
  }
}

export function hostPath(path, pathType = 'Directory') {
  return { tag: 'host-path', val: { path, pathType } };
}

export function nfs(server, path, readOnly = false) {
  return { tag: 'nfs', val: { server, path, readOnly } };
}

export function jsonSource(text) {
  return { tag: 'json', val: text };
}

export function hostnameAffinity(node) {
  return [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [node] }] }];
}

/** A volume answer; `capacityBytes` is a BigInt or a number. */
export function volume(capacityBytes, source, { node, labels = {}, annotations = {}, mountOptions = [] } = {}) {
  return {
    capacityBytes: BigInt(capacityBytes),
    source,
    nodeAffinity: node ? hostnameAffinity(node) : [],
    labels: Object.entries(labels),
    annotations: Object.entries(annotations),
    mountOptions,
    volumeMode: undefined,
  };
}

/** A value of a string map (an array of [key, value]), or undefined. */
export function lookup(pairs, key) {
  const found = pairs.find(([k]) => k === key);
  return found ? found[1] : undefined;
}

// --- Parameters ------------------------------------------------------------------------

const TRUE = new Set(['1', 't', 'T', 'true', 'TRUE', 'True']);
const FALSE = new Set(['0', 'f', 'F', 'false', 'FALSE', 'False']);

export class Params {
  constructor(pairs) { this.map = new Map(pairs); }
  isEmpty() { return this.map.size === 0; }
  get(key) { const v = this.map.get(key); return v ? v : undefined; }
  getOr(key, dflt) { return this.get(key) ?? dflt; }
  require(key, hint) {
    const v = this.get(key);
    if (v === undefined) throw new ParamError(`StorageClass parameter \`${key}\` is required: ${hint}`);
    return v;
  }
  oneOf(key, allowed, dflt) {
    const v = this.getOr(key, dflt);
    if (!allowed.includes(v)) {
      throw new ParamError(`StorageClass parameter \`${key}\` is ${JSON.stringify(v)}: set it to one of ${allowed.join(', ')}`);
    }
    return v;
  }
  bool(key, dflt) {
    const v = this.get(key);
    if (v === undefined) return dflt;
    if (TRUE.has(v)) return true;
    if (FALSE.has(v)) return false;
    throw new ParamError(`StorageClass parameter \`${key}\` is ${JSON.stringify(v)}: set it to true or false`);
  }
  /** A Kubernetes quantity (`10Gi`, `500M`, `1.5Gi`, see parseQuantity) as a BigInt of bytes. */
  quantity(key, dflt, hint) {
    const v = dflt === undefined ? this.require(key, hint) : this.getOr(key, dflt);
    try { return parseQuantity(v); } catch (e) { throw new ParamError(`StorageClass parameter \`${key}\`: ${e.message}`); }
  }
  absolutePath(key, dflt, hint) {
    const v = dflt === undefined ? this.require(key, hint) : this.getOr(key, dflt);
    try { return checkAbsolute(v); } catch (e) {
      throw new ParamError(`StorageClass parameter \`${key}\`: ${e.message}: set it to an absolute path`);
    }
  }
  rejectUnknown(known) {
    const unknown = [...this.map.keys()].filter((k) => !known.includes(k)).sort();
    if (unknown.length) {
      throw new ParamError(`unknown StorageClass parameter(s) ${unknown.join(', ')}: the known ones are ${known.join(', ')}`);
    }
  }
}

const BINARY = { Ki: 10n, Mi: 20n, Gi: 30n, Ti: 40n, Pi: 50n, Ei: 60n };
const DECIMAL = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const QUANTITY = /^([+-]?)([0-9]*)(?:\.([0-9]*))?([eE][+-]?[0-9]{1,6}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$/;

/**
 * Bytes (BigInt) of a Kubernetes quantity (`10Gi`, `500M`, `1.5Gi`, `1e9`, `100m`),
 * exactly as the API server and the host read it: the grammar of
 * `apimachinery/pkg/api/resource`, integer arithmetic, a fraction of a byte rounded up
 * (as `Quantity.Value()` does). Throws (naming the text) when it is not a quantity, is
 * negative or is 16Ei or more.
 */
export function parseQuantity(text) {
  const t = String(text);
  const m = QUANTITY.exec(t);
  if (!m || !(m[2] || m[3])) throw new Error(`${JSON.stringify(t)} is not a Kubernetes quantity: write it like 10Gi, 500M or 1e9`);
  const [, sign, whole, fraction = '', suffix] = m;
  if ((whole + fraction).replace(/^0+|0+$/g, '').length > 38) throw new Error(`${JSON.stringify(t)} has more than 38 significant digits`);
  let numerator = BigInt(whole + fraction || '0');
  let denominator = 10n ** BigInt(fraction.length);
  if (numerator === 0n) return 0n;
  if (sign === '-') throw new Error(`${JSON.stringify(t)} is negative: a size must be zero or more`);
  const tooLarge = () => new Error(`${JSON.stringify(t)} is too large: a size must fit in 64 bits of bytes (under 16Ei)`);
  let exponent = 0;
  if (suffix in BINARY) numerator <<= BINARY[suffix];
  else if (suffix in DECIMAL) exponent = DECIMAL[suffix];
  else exponent = Number(suffix.slice(1));
  // Bounds before the powers: value >= 10^(exponent - fraction digits), < 10^(whole digits + exponent).
  if (exponent - fraction.length >= 20) throw tooLarge();
  if (whole.length + exponent <= 0) return 1n; // 0 < value < 1: one byte
  if (exponent >= 0) numerator *= 10n ** BigInt(exponent);
  else denominator *= 10n ** BigInt(-exponent);
  const size = (numerator + denominator - 1n) / denominator;
  if (size >= 1n << 64n) throw tooLarge();
  return size;
}

export function formatBytes(n) {
  n = BigInt(n);
  for (const s of ['Ei', 'Pi', 'Ti', 'Gi', 'Mi', 'Ki']) {
    const unit = 1n << BINARY[s];
    if (n !== 0n && n % unit === 0n) return `${n / unit}${s}`;
  }
  return String(n);
}

/** The StorageClass parameter bounding one `delete` call's work (entries removed). */
export const DELETE_CHUNK_PARAMETER = 'deleteChunkEntries';
/** Entries one `delete` call removes at most when the class does not say (as the Rust SDK). */
export const DEFAULT_DELETE_CHUNK = 100000;

/**
 * The entries one `delete` call may remove (the budget of `Dir.removeTree`): the class
 * parameter `deleteChunkEntries` (1 to 10000000), else DEFAULT_DELETE_CHUNK. Throws a
 * ParamError naming the parameter.
 */
export function deleteBudget(params) {
  const v = params.get(DELETE_CHUNK_PARAMETER);
  if (v === undefined) return DEFAULT_DELETE_CHUNK;
  const n = /^[0-9]{1,8}$/.test(v) ? Number(v) : 0;
  if (n < 1 || n > 10000000) {
    throw new ParamError(`StorageClass parameter \`${DELETE_CHUNK_PARAMETER}\` is ${JSON.stringify(v)}: set it to a whole number of entries from 1 to 10000000 (default ${DEFAULT_DELETE_CHUNK})`);
  }
  return n;
}

// --- Paths -----------------------------------------------------------------------------

export function checkComponent(name) {
  if (name === '' || name === '.' || name === '..') throw new Error(`${JSON.stringify(name)} is not a usable name`);
  // eslint-disable-next-line no-control-regex
  if (/[/\u0000-\u001f\u007f-\u009f]/.test(name)) throw new Error(`${JSON.stringify(name)} contains \`/\` or a control character`);
  if (new TextEncoder().encode(name).length > 255) throw new Error(`${JSON.stringify(name.slice(0, 40))}... is longer than 255 bytes`);
  return name;
}

export function checkPvName(name) {
  if (!/^pvc-[a-z0-9-]{1,249}$/.test(name)) throw new Error(`${JSON.stringify(name)} is not a PV name of this host (pvc-<claim uid>)`);
  return name;
}

export function checkAbsolute(path) {
  if (!path.startsWith('/')) throw new Error(`${JSON.stringify(path)} is not absolute`);
  const parts = path.split('/').filter((p) => p);
  parts.forEach(checkComponent);
  return '/' + parts.join('/');
}

export function join(base, ...names) {
  return [base.replace(/\/+$/, ''), ...names.map(checkComponent)].join('/') || '/';
}

// --- Files in granted directories (wasi:filesystem, never following symlinks) -----------

const NOFOLLOW = {};
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The WASI error code of a thrown filesystem error ('no-entry', ...), or undefined. */
export function errorCode(e) {
  return e && typeof e.payload === 'string' ? e.payload : undefined;
}

/**
 * An open directory inside a grant. `Dir.open('/volumes')` finds the grant (a WASI
 * preopen) holding that guest path and opens the rest one component at a time.
 */
export class Dir {
  constructor(descriptor, path) { this.descriptor = descriptor; this.path = path; }

  static open(guestPath) {
    const path = checkAbsolute(guestPath);
    let best;
    for (const [descriptor, root] of getDirectories()) {
      const r = root === '/' ? '' : root.replace(/\/+$/, '');
      if ((path === r || path.startsWith(r + '/')) && (!best || r.length > best[1].length)) {
        best = [descriptor, r];
      }
    }
    if (!best) throw new Failed(`${path} is not in a granted directory: the cluster admin grants it in the grants file`);
    let dir = new Dir(best[0], best[1] || '/');
    for (const part of path.slice(best[1].length).split('/').filter((p) => p)) dir = dir.openDir(part);
    return dir;
  }

  openDir(name) {
    const d = this.descriptor.openAt(NOFOLLOW, checkComponent(name), { directory: true }, { read: true, mutateDirectory: true });
    return new Dir(d, join(this.path, name));
  }

  /** 'directory', 'regular-file', 'symbolic-link', ... or undefined if missing. */
  typeOf(name) {
    try { return this.descriptor.statAt(NOFOLLOW, checkComponent(name)).type; } catch (e) {
      if (errorCode(e) === 'no-entry') return undefined;
      throw e;
    }
  }

  mkdir(name) {
    try { this.descriptor.createDirectoryAt(checkComponent(name)); } catch (e) {
      if (errorCode(e) !== 'exist') throw e;
    }
  }

  readText(name) {
    const f = this.descriptor.openAt(NOFOLLOW, checkComponent(name), {}, { read: true });
    const chunks = [];
    let offset = 0n;
    for (;;) {
      const [bytes, eof] = f.read(65536n, offset);
      chunks.push(decoder.decode(bytes, { stream: true }));
      offset += BigInt(bytes.length);
      if (eof || bytes.length === 0) break;
    }
    return chunks.join('') + decoder.decode();
  }

  writeText(name, text) {
    const f = this.descriptor.openAt(NOFOLLOW, checkComponent(name), { create: true, truncate: true }, { write: true });
    const bytes = encoder.encode(text);
    let offset = 0;
    while (offset < bytes.length) offset += Number(f.write(bytes.subarray(offset), BigInt(offset)));
  }

  rename(from, to) { this.descriptor.renameAt(checkComponent(from), this.descriptor, checkComponent(to)); }
  unlink(name) { this.descriptor.unlinkFileAt(checkComponent(name)); }
  rmdir(name) { this.descriptor.removeDirectoryAt(checkComponent(name)); }

  /** Names in this directory (without `.` and `..`). */
  entries() {
    const stream = this.descriptor.readDirectory();
    const out = [];
    for (let e = stream.readDirectoryEntry(); e; e = stream.readDirectoryEntry()) out.push(e);
    return out;
  }

  /**
   * Removes the subdirectory `name` and everything in it, without recursion and
   * without following a symbolic link; stops after `budget` entries or `seconds`
   * (default 1), whichever comes first. Returns [entries removed, whether `name` is
   * gone]: call it again (answer InBackground meanwhile) to go on.
   */
  removeTree(name, budget, seconds = 1) {
    const deadline = Date.now() + seconds * 1000;
    let removed = 0;
    const stack = [[this, name]];
    while (stack.length) {
      const [parent, child] = stack[stack.length - 1];
      const dir = parent.openDir(child);
      let pushed = false;
      for (const entry of dir.entries()) {
        if (removed >= budget || Date.now() >= deadline) return [removed, false];
        if (entry.type === 'directory') { stack.push([dir, entry.name]); pushed = true; break; }
        dir.unlink(entry.name);
        removed += 1;
      }
      if (!pushed) { parent.rmdir(child); removed += 1; stack.pop(); }
    }
    return [removed, true];
  }
}
