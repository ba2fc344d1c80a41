// {{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
// inside the directory the cluster admin granted this module, published as the hostPath
// `nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible.
import * as sdk from './sdk/wasm-provisioner-sdk.js';

const ANN_GUEST_ROOT = '{{name}}/guest-root';

class Guest {
  describe() {
    return sdk.pluginInfo('{{name}}', '0.1.0');
  }

  provision(req) {
    const params = new sdk.Params(req.class.parameters);
    params.rejectUnknown(['nodePath', 'guestRoot', 'maxSize']);
    const nodePath = params.absolutePath('nodePath', undefined, 'the granted directory on the nodes');
    const guestRoot = params.absolutePath('guestRoot', '/volumes');
    const maxSize = params.quantity('maxSize', '1Gi');
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
      const [removed, done] = root.removeTree(name, 100000);
      if (!done) throw new sdk.InBackground(`{{name}}: deleted ${removed} entries of ${name}; the rest goes in the next calls`);
    }
    sdk.log.info('deleted', { volume: name });
  }
}

const plugin = sdk.exportProvisioner(new Guest());
export const { describe, shouldProvision, provision, shouldDelete } = plugin;
const remove = plugin.delete;
export { remove as delete };
