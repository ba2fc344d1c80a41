"""{{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
inside the directory the cluster admin granted this module, published as the hostPath
`nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible."""

import os
import shutil

import wasm_provisioner_sdk as sdk

ANN_GUEST_ROOT = "{{name}}/guest-root"


class Guest(sdk.Provisioner):
    def describe(self):
        return sdk.PluginInfo(name="{{name}}", version="0.1.0", supports_block=False,
                              data_source_kinds=[])

    def provision(self, req):
        params = sdk.Params(req.class_.parameters)
        params.reject_unknown(["nodePath", "guestRoot", "maxSize"])
        node_path = params.absolute_path("nodePath", None, "the granted directory on the nodes")
        guest_root = params.absolute_path("guestRoot", "/volumes", "")
        max_size = params.quantity("maxSize", "1Gi", "")
        if req.claim.requested_bytes > max_size:
            raise sdk.Infeasible(
                f"{{name}}: the claim asks for {sdk.format_bytes(req.claim.requested_bytes)}, "
                f"more than maxSize {sdk.format_bytes(max_size)}")
        name = sdk.check_pv_name(req.volume_name)
        path = sdk.join(guest_root, name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise sdk.Failed(f"{{name}}: cannot create {path}: {exc}")
        sdk.info("provisioned", volume=name, dir=path)
        return sdk.volume(req.claim.requested_bytes,
                          sdk.host_path(sdk.join(node_path, name), "Directory"),
                          annotations={ANN_GUEST_ROOT: guest_root})

    def delete(self, req):
        params = sdk.Params(req.class_parameters)
        annotated = sdk.lookup(req.volume.annotations, ANN_GUEST_ROOT) or "/volumes"
        guest_root = params.absolute_path("guestRoot", annotated, "")
        name = sdk.check_pv_name(req.volume.name)
        path = sdk.join(guest_root, name)
        if os.path.islink(path):
            raise sdk.Failed(f"{{name}}: {path} is a symbolic link; not touched")
        if os.path.isdir(path):
            shutil.rmtree(path)
        sdk.info("deleted", volume=name, dir=path)


WitWorld = sdk.export(Guest)
