// quota-dir-js: the JavaScript example guest, the same plugin as the Python quota-dir
// (see guests/README.md, "quota-dir"): a directory per volume under a granted host
// directory, refusing claims above `maxSize` (infeasible), a pool above `poolSize`
// (failed, retried), claims of namespaces not listed in `namespaces` (ignored);
// usage recorded in `guestRoot/.quota-dir/<pv-name>`; `onDelete` delete, archive or
// retain. It has one optional capability, `report-capacity` (`getCapacity`): the pool's
// size and what is left of it when the class sets `poolSize`, else the granted
// filesystem's size and free space.
import * as sdk from 'wasm-provisioner-sdk';

const NAME = 'quota-dir-js';
const VERSION = '0.1.0';
const RECORDS = '.quota-dir';
const ANN_GUEST_ROOT = 'quota-dir/guest-root';
const ANN_ON_DELETE = 'quota-dir/on-delete';
const ANN_SIZE = 'quota-dir/size';
const KNOWN = ['nodePath', 'guestRoot', 'maxSize', 'poolSize', 'namespaces', 'onDelete', 'deleteChunkEntries'];
const ON_DELETE = ['delete', 'archive', 'retain'];

function readRecord(dir, name) {
  if (dir.typeOf(name) === undefined) return undefined;
  const size = /^([0-9]+) /.exec(dir.readText(name));
  if (!size) throw new sdk.Failed(`quota-dir: the usage record ${dir.path}/${name} is unreadable; fix or remove it`);
  return BigInt(size[1]);
}

function usedBytes(records, exclude) {
  let total = 0n;
  for (const entry of records.entries()) {
    if (entry.name === exclude || entry.name.endsWith('.tmp')) continue;
    total += readRecord(records, entry.name) ?? 0n;
  }
  return total;
}

class QuotaDir {
  describe() {
    return sdk.pluginInfo(NAME, VERSION);
  }

  provision(req) {
    const params = new sdk.Params(req.class.parameters);
    params.rejectUnknown(KNOWN);
    const claim = req.claim;
    const namespaces = params.getOr('namespaces', '').split(',').map((n) => n.trim()).filter((n) => n);
    if (namespaces.length && !namespaces.includes(claim.namespace)) {
      throw new sdk.Ignored(`quota-dir: namespace ${claim.namespace} is not one of this class's namespaces (${namespaces.join(', ')})`);
    }
    const nodePath = params.absolutePath('nodePath', undefined, "the granted directory's path on the nodes, such as /var/lib/quota");
    const guestRoot = params.absolutePath('guestRoot', '/volumes');
    const maxSize = params.quantity('maxSize', undefined, 'the largest claim this class accepts, such as 10Gi');
    const poolSize = params.quantity('poolSize', '0');
    const onDelete = params.oneOf('onDelete', ON_DELETE, 'delete');
    if (claim.volumeMode === 'block') throw new sdk.Infeasible('quota-dir makes filesystem volumes only; volumeMode Block is not supported');
    if (claim.dataSource !== undefined || claim.selector !== undefined) throw new sdk.Infeasible('quota-dir does not support a data source or a selector');
    const size = BigInt(claim.requestedBytes);
    if (size > maxSize) {
      throw new sdk.Infeasible(`quota-dir: the claim asks for ${sdk.formatBytes(size)}, more than this class's maxSize ${sdk.formatBytes(maxSize)}; ask for at most ${sdk.formatBytes(maxSize)} or use another class`);
    }
    const name = sdk.checkPvName(req.volumeName);
    const root = sdk.Dir.open(guestRoot);
    root.mkdir(RECORDS);
    const records = root.openDir(RECORDS);
    let recorded = readRecord(records, name);
    if (recorded === undefined) {
      const used = usedBytes(records, name);
      if (poolSize && used + size > poolSize) {
        throw new sdk.Failed(`quota-dir: the pool is full: ${sdk.formatBytes(used)} of ${sdk.formatBytes(poolSize)} recorded, ${sdk.formatBytes(size)} more does not fit; it will once other volumes of the pool are deleted`);
      }
      // The record first (written aside, then renamed): usage is never lost.
      records.writeText(`${name}.tmp`, `${size} ${claim.namespace}/${claim.name}\n`);
      records.rename(`${name}.tmp`, name);
      recorded = size;
    }
    const type = root.typeOf(name);
    if (type !== undefined && type !== 'directory') throw new sdk.Failed(`quota-dir: ${guestRoot}/${name} exists and is not a directory; remove it`);
    root.mkdir(name);
    sdk.log.info('provisioned', {
      volume: name,
      size: sdk.formatBytes(recorded),
      pool_used: sdk.formatBytes(usedBytes(records)),
      pool_size: poolSize ? sdk.formatBytes(poolSize) : 'unlimited',
    });
    return sdk.volume(recorded, sdk.hostPath(sdk.join(nodePath, name), 'Directory'), {
      node: req.selectedNode?.name,
      annotations: { [ANN_GUEST_ROOT]: guestRoot, [ANN_ON_DELETE]: onDelete, [ANN_SIZE]: sdk.formatBytes(recorded) },
    });
  }

  // Capability `report-capacity`: with a `poolSize`, the pool (minus the recorded
  // usage, archived volumes included); without, the granted filesystem itself.
  getCapacity(req) {
    const params = new sdk.Params(req.class.parameters);
    const guestRoot = params.absolutePath('guestRoot', '/volumes');
    const poolSize = params.quantity('poolSize', '0');
    const maxSize = params.quantity('maxSize', undefined, 'the largest claim this class accepts, such as 10Gi');
    if (!poolSize) {
      const fs = sdk.statFilesystem(guestRoot);
      return sdk.capacity(fs.totalBytes, fs.availableBytes, maxSize < fs.availableBytes ? maxSize : undefined);
    }
    const root = sdk.Dir.open(guestRoot);
    const used = root.typeOf(RECORDS) === 'directory' ? usedBytes(root.openDir(RECORDS)) : 0n;
    const left = used >= poolSize ? 0n : poolSize - used;
    return sdk.capacity(poolSize, left, maxSize < left ? maxSize : undefined);
  }

  delete(req) {
    const pv = req.volume;
    const params = new sdk.Params(req.classParameters);
    const guestRoot = params.absolutePath('guestRoot', sdk.lookup(pv.annotations, ANN_GUEST_ROOT) ?? '/volumes');
    const onDelete = params.oneOf('onDelete', ON_DELETE, sdk.lookup(pv.annotations, ANN_ON_DELETE) ?? 'delete');
    const chunk = Number(params.quantity('deleteChunkEntries', '20000'));
    const name = sdk.checkPvName(pv.name);
    if (pv.source.tag !== 'host-path' || !pv.source.val.path.endsWith(`/${name}`)) {
      throw new sdk.Failed(`quota-dir: ${name} is not a hostPath volume ending in its name; not touched`);
    }
    if (onDelete === 'retain') {
      sdk.log.info('retained', { volume: name });
      return;
    }
    const root = sdk.Dir.open(guestRoot);
    const type = root.typeOf(name);
    if (type !== undefined && type !== 'directory') throw new sdk.Failed(`quota-dir: ${guestRoot}/${name} is not a directory; remove it by hand`);
    const hasRecords = root.typeOf(RECORDS) === 'directory';
    const records = hasRecords ? root.openDir(RECORDS) : undefined;
    if (onDelete === 'archive') {
      if (type) root.rename(name, `archived-${name}`);
      if (records && records.typeOf(name)) records.rename(name, `archived-${name}`);
      sdk.log.info('archived', { volume: name, to: `archived-${name}` });
      return;
    }
    if (type) {
      const [removed, done] = root.removeTree(name, chunk);
      if (!done) throw new sdk.InBackground(`quota-dir: deleted ${removed} entries of ${name}; the rest goes in the next calls`);
    }
    if (records && records.typeOf(name)) records.unlink(name);
    sdk.log.info('deleted', { volume: name });
  }
}

export const { provisioner, expander, capacityReporter, classValidator } =
  sdk.exportPlugin(new QuotaDir());
