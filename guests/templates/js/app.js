// {{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
// inside the directory the cluster admin granted this module, published as the hostPath
// `nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible.
//
// Optional capabilities (contract 0.2) are methods: this plugin has `validateClass` (the
// host checks a StorageClass with it before any claim of it fails). Add `expand` (grow a
// volume) or `getCapacity` (the backend's space) to have those too; the build exports
// exactly the capabilities the plugin implements and `describe` lists them.
import * as sdk from 'wasm-provisioner-sdk';

const ANN_GUEST_ROOT = '{{name}}/guest-root';

/** The class's parameters, checked (throws sdk.ParamError). */
function settings(parameters) {
  const params = new sdk.Params(parameters);
  // deleteChunkEntries: the entries one `delete` call removes at most (sdk.deleteBudget).
  params.rejectUnknown(['nodePath', 'guestRoot', 'maxSize', sdk.DELETE_CHUNK_PARAMETER]);
  sdk.deleteBudget(params);
  return {
    nodePath: params.absolutePath('nodePath', undefined, 'the granted directory on the nodes'),
    guestRoot: params.absolutePath('guestRoot', '/volumes'),
    maxSize: params.quantity('maxSize', '1Gi'),
  };
}

class Guest {
  describe() {
    return sdk.pluginInfo('{{name}}', '0.1.0');
  }

  // Capability `validate-class`: throw to refuse the class (the message goes to the admin).
  validateClass(cls) {
    settings(cls.parameters);
  }

  // Capability `expand`: uncomment to grow volumes (classes with allowVolumeExpansion).
  // expand(req) {
  //   const { maxSize } = settings(req.classParameters);
  //   if (req.requestedBytes > maxSize) throw new sdk.Infeasible(`{{name}}: more than maxSize ${sdk.formatBytes(maxSize)}`);
  //   return req.requestedBytes; // the new size: a directory has no size of its own
  // }

  provision(req) {
    const { nodePath, guestRoot, maxSize } = settings(req.class.parameters);
    if (req.claim.requestedBytes > maxSize) {
      throw new sdk.Infeasible(`{{name}}: the claim asks for ${sdk.formatBytes(req.claim.requestedBytes)}, more than maxSize ${sdk.formatBytes(maxSize)}`);
    }
    const name = sdk.checkPvName(req.volumeName);
    sdk.Dir.open(guestRoot).mkdir(name);
    sdk.log.info('provisioned', { volume: name, dir: `${guestRoot}/${name}` });
    return sdk.volume(req.claim.requestedBytes, sdk.hostPath(sdk.join(nodePath, name), 'Directory'), {
      annotations: { [ANN_GUEST_ROOT]: guestRoot },
    });
  }

  delete(req) {
    const params = new sdk.Params(req.classParameters);
    const guestRoot = params.absolutePath('guestRoot', sdk.lookup(req.volume.annotations, ANN_GUEST_ROOT) ?? '/volumes');
    const name = sdk.checkPvName(req.volume.name);
    const root = sdk.Dir.open(guestRoot);
    const type = root.typeOf(name);
    if (type !== undefined && type !== 'directory') throw new sdk.Failed(`{{name}}: ${guestRoot}/${name} is not a directory; not touched`);
    if (type) {
      // Bounded and resumable: `in-background` until it is gone, and the host calls again.
      const [removed, done] = root.removeTree(name, sdk.deleteBudget(params));
      if (!done) throw new sdk.InBackground(`{{name}}: deleted ${removed} entries of ${name}; the rest goes in the next calls`);
    }
    sdk.log.info('deleted', { volume: name });
  }
}

// One export per interface: `provisioner`, and each capability the plugin implements.
export const { provisioner, expander, capacityReporter, classValidator } =
  sdk.exportPlugin(new Guest());
