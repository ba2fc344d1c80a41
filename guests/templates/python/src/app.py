"""{{name}}: a wasm-provisioner guest. One directory per volume, `guestRoot/<pv-name>`
inside the directory the cluster admin granted this module, published as the hostPath
`nodePath/<pv-name>`. Claims above the class's `maxSize` are infeasible.

Optional capabilities (contract 0.2) are methods: this plugin has `validate_class`
(the host checks a StorageClass with it before any claim of it fails). Define `expand`
(grow a volume) or `get_capacity` (the backend's space) to have those too; build.sh
exports exactly the capabilities the plugin defines and `describe` lists them."""

import os

import wasm_provisioner_sdk as sdk

ANN_GUEST_ROOT = "{{name}}/guest-root"


def settings(parameters):
    """The class's parameters, checked (raises sdk.ParamError): (nodePath, guestRoot,
    maxSize)."""
    params = sdk.Params(parameters)
    # deleteChunkEntries: the entries one `delete` call removes at most (sdk.delete_budget).
    params.reject_unknown(["nodePath", "guestRoot", "maxSize", sdk.DELETE_CHUNK_PARAMETER])
    sdk.delete_budget(params)
    return (params.absolute_path("nodePath", None, "the granted directory on the nodes"),
            params.absolute_path("guestRoot", "/volumes", ""),
            # A Kubernetes quantity (10Gi, 500M, 1.5Gi), read exactly as the API server does.
            params.quantity("maxSize", "1Gi", ""))


class Guest(sdk.Provisioner):
    def describe(self):
        return sdk.PluginInfo(name="{{name}}", version="0.1.0")

    # Capability `validate-class`: raise to refuse the class (the message goes to the admin).
    def validate_class(self, cls):
        settings(cls.parameters)

    # Capability `expand`: uncomment to grow volumes (classes with allowVolumeExpansion).
    # def expand(self, req):
    #     _, _, max_size = settings(req.class_parameters)
    #     if req.requested_bytes > max_size:
    #         raise sdk.Infeasible(f"{{name}}: more than maxSize {sdk.format_bytes(max_size)}")
    #     return req.requested_bytes   # the new size: a directory has no size of its own

    def provision(self, req):
        node_path, guest_root, max_size = settings(req.class_.parameters)
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
        # What a tenant wrote is hostile input (deep trees, huge directories): delete in
        # bounded, resumable chunks, never following a symbolic link; answer
        # `in-background` until it is gone, and the host calls again.
        removed, done = sdk.remove_tree(path, sdk.delete_budget(params))
        if not done:
            raise sdk.InBackground(
                f"{{name}}: deleted {removed} entries of {path}; the rest goes in the next calls")
        sdk.info("deleted", volume=name, dir=path)


sdk.export(Guest)
