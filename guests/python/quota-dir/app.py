"""quota-dir: a directory per volume under a granted host directory, with a quota.

The Python example guest (see guests/README.md, "quota-dir"). Each claim gets
`guestRoot/<pv-name>`, published as hostPath `nodePath/<pv-name>`. Claims above the
class's `maxSize` can never fit (`infeasible`); a claim that would take the recorded
usage of all the class's volumes past `poolSize` is `failed` (retried: it fits once
other volumes are deleted). Each volume's size is recorded in
`guestRoot/.quota-dir/<pv-name>`; `delete` removes the directory and its record,
`archive` renames both to `archived-<pv-name>` (archived volumes still count against
`poolSize` until an admin removes them), `retain` leaves both.

Optional capabilities (contract 0.2): `validate_class` checks a class's parameters
before any claim of it (the checks `provision` makes, and `maxSize` at most
`poolSize`); `expand` grows a volume by recording its new size, refusing sizes above
`maxSize` (infeasible) and, like `provision`, beyond the pool (failed).
"""

import os

import wasm_provisioner_sdk as sdk

NAME = "quota-dir"
VERSION = "0.2.0"
RECORDS = ".quota-dir"
ANN_GUEST_ROOT = "quota-dir/guest-root"
ANN_ON_DELETE = "quota-dir/on-delete"
ANN_SIZE = "quota-dir/size"
KNOWN = ["nodePath", "guestRoot", "maxSize", "poolSize", "namespaces", "onDelete",
         "deleteChunkEntries"]
ON_DELETE = ["delete", "archive", "retain"]


class Settings:
    """A class's parameters, checked: what `validate_class` answers, and where
    `provision` and `expand` start. Raises `sdk.ParamError`."""

    def __init__(self, parameters):
        params = sdk.Params(parameters)
        params.reject_unknown(KNOWN)
        self.namespaces = [n.strip() for n in params.get_or("namespaces", "").split(",")
                           if n.strip()]
        self.node_path = params.absolute_path(
            "nodePath", None, "the granted directory's path on the nodes, such as /var/lib/quota")
        self.guest_root = params.absolute_path("guestRoot", "/volumes", "")
        self.max_size = params.quantity(
            "maxSize", None, "the largest claim this class accepts, such as 10Gi")
        self.pool_size = params.quantity("poolSize", "0", "")
        self.on_delete = params.one_of("onDelete", ON_DELETE, "delete")
        params.quantity("deleteChunkEntries", "20000", "")
        if self.pool_size and self.max_size > self.pool_size:
            raise sdk.ParamError(
                f"StorageClass parameter `maxSize` ({sdk.format_bytes(self.max_size)}) is larger "
                f"than `poolSize` ({sdk.format_bytes(self.pool_size)}): no volume that big fits; "
                "lower maxSize or raise poolSize")


class QuotaDir(sdk.Provisioner):
    def describe(self):
        return sdk.PluginInfo(name=NAME, version=VERSION)

    def validate_class(self, cls):
        Settings(cls.parameters)

    def provision(self, req):
        params = sdk.Params(req.class_.parameters)
        params.reject_unknown(KNOWN)
        claim = req.claim
        namespaces = [n.strip() for n in params.get_or("namespaces", "").split(",") if n.strip()]
        if namespaces and claim.namespace not in namespaces:
            raise sdk.Ignored(
                f"quota-dir: namespace {claim.namespace} is not one of this class's "
                f"namespaces ({', '.join(namespaces)})")
        settings = Settings(req.class_.parameters)
        node_path = settings.node_path
        guest_root = settings.guest_root
        max_size = settings.max_size
        pool_size = settings.pool_size
        on_delete = settings.on_delete
        if claim.volume_mode == sdk.VolumeMode.BLOCK:
            raise sdk.Infeasible("quota-dir makes filesystem volumes only; volumeMode Block is not supported")
        if claim.data_source is not None or claim.selector is not None:
            raise sdk.Infeasible("quota-dir does not support a data source or a selector")
        size = claim.requested_bytes
        if size > max_size:
            raise sdk.Infeasible(
                f"quota-dir: the claim asks for {sdk.format_bytes(size)}, more than this class's "
                f"maxSize {sdk.format_bytes(max_size)}; ask for at most {sdk.format_bytes(max_size)} "
                "or use another class")
        name = sdk.check_pv_name(req.volume_name)
        records = os.path.join(guest_root, RECORDS)
        volume_dir = os.path.join(guest_root, name)
        record = os.path.join(records, name)
        if not os.path.isdir(guest_root):
            raise sdk.Failed(
                f"quota-dir: {guest_root} is not granted (or not a directory): the cluster admin "
                "grants this module a read-write directory there in the grants file")

        os.makedirs(records, exist_ok=True)
        existing = _read_record(record)
        if existing is None:
            used = _used_bytes(records, exclude=name)
            if pool_size and used + size > pool_size:
                raise sdk.Failed(
                    f"quota-dir: the pool is full: {sdk.format_bytes(used)} of "
                    f"{sdk.format_bytes(pool_size)} recorded, {sdk.format_bytes(size)} more does not "
                    "fit; it will once other volumes of the pool are deleted")
            # The record first (written aside, then renamed): usage is never lost.
            tmp = record + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{size} {claim.namespace}/{claim.name}\n")
            os.rename(tmp, record)
            existing = size
        if os.path.islink(volume_dir) or (os.path.exists(volume_dir) and not os.path.isdir(volume_dir)):
            raise sdk.Failed(f"quota-dir: {volume_dir} exists and is not a directory; remove it")
        os.makedirs(volume_dir, exist_ok=True)
        used = _used_bytes(records, exclude=None)
        sdk.info("provisioned", volume=name, size=sdk.format_bytes(existing),
                 pool_used=sdk.format_bytes(used),
                 pool_size=sdk.format_bytes(pool_size) if pool_size else "unlimited")
        node = req.selected_node.name if req.selected_node else None
        return sdk.volume(
            existing,
            sdk.host_path(sdk.join(node_path, name), "Directory"),
            node=node,
            annotations={ANN_GUEST_ROOT: guest_root, ANN_ON_DELETE: on_delete,
                         ANN_SIZE: sdk.format_bytes(existing)},
        )

    def expand(self, req):
        settings = Settings(req.class_parameters)
        name = sdk.check_pv_name(req.volume.name)
        size = req.requested_bytes
        if size > settings.max_size:
            raise sdk.Infeasible(
                f"quota-dir: {name} cannot grow to {sdk.format_bytes(size)}: more than this "
                f"class's maxSize {sdk.format_bytes(settings.max_size)}")
        records = os.path.join(settings.guest_root, RECORDS)
        record = os.path.join(records, name)
        recorded = _read_record(record)
        if recorded is None:
            raise sdk.Failed(
                f"quota-dir: {name} has no usage record in {records}: not a volume of this "
                "class, or its record was removed")
        if recorded >= size:
            return recorded  # Already that big: the same answer again (idempotent).
        if settings.pool_size:
            used = _used_bytes(records, exclude=name)
            if used + size > settings.pool_size:
                raise sdk.Failed(
                    f"quota-dir: the pool is full: {sdk.format_bytes(used)} of "
                    f"{sdk.format_bytes(settings.pool_size)} recorded for other volumes, "
                    f"{sdk.format_bytes(size)} does not fit; it will once other volumes "
                    "of the pool are deleted")
        with open(record) as f:
            owner = (f.read().split(maxsplit=1)[1:] or [""])[0].strip()
        tmp = record + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{size} {owner}\n")
        os.rename(tmp, record)
        sdk.info("expanded", volume=name, was=sdk.format_bytes(recorded),
                 size=sdk.format_bytes(size))
        return size

    def delete(self, req):
        pv = req.volume
        annotations = dict(pv.annotations)
        params = sdk.Params(req.class_parameters)
        guest_root = params.absolute_path(
            "guestRoot", annotations.get(ANN_GUEST_ROOT, "/volumes"), "")
        on_delete = params.one_of("onDelete", ON_DELETE, annotations.get(ANN_ON_DELETE, "delete"))
        chunk = int(params.quantity("deleteChunkEntries", "20000", ""))
        name = sdk.check_pv_name(pv.name)
        source = pv.source
        if not isinstance(source, sdk.types.VolumeSource_HostPath) or \
                os.path.basename(source.value.path) != name:
            raise sdk.Failed(f"quota-dir: {name} is not a hostPath volume ending in its name; not touched")
        volume_dir = os.path.join(guest_root, name)
        record = os.path.join(guest_root, RECORDS, name)
        if on_delete == "retain":
            sdk.info("retained", volume=name, path=volume_dir)
            return
        if os.path.islink(volume_dir) or (os.path.exists(volume_dir) and not os.path.isdir(volume_dir)):
            raise sdk.Failed(f"quota-dir: {volume_dir} is not a directory; remove it by hand")
        if on_delete == "archive":
            if os.path.isdir(volume_dir):
                os.rename(volume_dir, os.path.join(guest_root, "archived-" + name))
            if os.path.exists(record):
                os.rename(record, os.path.join(guest_root, RECORDS, "archived-" + name))
            sdk.info("archived", volume=name, to="archived-" + name)
            return
        if os.path.isdir(volume_dir):
            removed, done = sdk.remove_tree(volume_dir, chunk)
            if not done:
                raise sdk.InBackground(
                    f"quota-dir: deleted {removed} entries of {name}; the rest goes in the next calls")
        if os.path.exists(record):
            os.unlink(record)
        sdk.info("deleted", volume=name)


def _read_record(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except FileNotFoundError:
        return None
    except (ValueError, IndexError):
        raise sdk.Failed(f"quota-dir: the usage record {path} is unreadable; fix or remove it")


def _used_bytes(records, exclude):
    total = 0
    for entry in os.scandir(records):
        if entry.name == exclude or entry.name.endswith(".tmp"):
            continue
        size = _read_record(entry.path)
        total += size or 0
    return total


sdk.export(QuotaDir)
