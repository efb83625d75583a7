"""Parsing the spec's volumes: the dataset (its volume, data directory and staging) and the checkpoints
volume. Pure."""

from __future__ import annotations

from dtjob.config import OperatorConfig
from dtjob.contract.training import DATA_SOURCES, DEFAULT_DATA_SOURCE
from dtjob.spec import validators as rules
from dtjob.spec.model import Dataset, DataVolume, NfsVolume, PvcVolume, Staging
from dtjob.spec.reader import Reader, SpecError
from dtjob.spec.storage import parse_stage_from, resolve_destination


def parse_volume(r: Reader, default_mount: str, nfs_read_only: bool) -> DataVolume:
    """An NFS share or an existing PVC with its mount path (spec.dataset.volume, spec.checkpoints)."""
    nfs = pvc = None
    if r.has("nfs"):
        n = r.child("nfs")
        server, path = n.required_string("server"), n.required_string("path")
        if len(server) > rules.NFS_SERVER_MAX or not rules.matches(rules.NFS_SERVER, server):
            raise SpecError(n.at("server"), f"must be a host name or an IP address, got {server!r}")
        if len(path) > rules.PATH_MAX or not rules.matches(rules.NFS_PATH, path):
            raise SpecError(
                n.at("path"),
                f"must be '/' or an absolute path without empty, '.' or '..' segments; got {path!r}",
            )
        nfs = NfsVolume(server, path, n.boolean("readOnly", nfs_read_only))
    if r.has("persistentVolumeClaim"):
        p = r.child("persistentVolumeClaim")
        claim = p.required_string("claimName")
        if (problem := rules.name_problem(claim, subdomain=True)) is not None:
            raise SpecError(p.at("claimName"), problem)
        pvc = PvcVolume(claim, p.boolean("readOnly", False))
    if nfs and pvc:
        raise SpecError(r.path, "set either nfs or persistentVolumeClaim, not both")
    if not nfs and not pvc:
        raise SpecError(r.path, "must set nfs or persistentVolumeClaim")
    mount_path = r.checked("mountPath", rules.path_problem) or default_mount
    reserved = rules.reserved_mount(mount_path)
    if reserved is not None:
        raise SpecError(
            r.at("mountPath"),
            f"{mount_path!r} collides with {reserved}, which the operator mounts itself "
            f"(reserved: {', '.join(rules.RESERVED_MOUNT_PATHS)})",
        )
    return DataVolume(nfs=nfs, pvc=pvc, mount_path=mount_path)


def parse_checkpoints(r: Reader, data: Dataset) -> DataVolume:
    volume = parse_volume(r, "/checkpoints", nfs_read_only=False)
    if volume.nfs is not None and volume.nfs.read_only:
        raise SpecError(r.at("nfs.readOnly"), "must be false: rank 0 writes its checkpoints there")
    if volume.pvc is not None and volume.pvc.read_only:
        raise SpecError(
            r.at("persistentVolumeClaim.readOnly"), "must be false: rank 0 writes its checkpoints there"
        )
    if data.volume is not None and data.volume.mount_path == volume.mount_path:
        raise SpecError(
            r.at("mountPath"), f"{volume.mount_path!r} is spec.dataset.volume's mount path too: use another"
        )
    return volume


def parse_dataset(r: Reader, config: OperatorConfig) -> Dataset:
    source = r.choice("source", DATA_SOURCES, DEFAULT_DATA_SOURCE)
    volume = parse_volume(r.child("volume"), "/data", nfs_read_only=True) if r.has("volume") else None
    if source == "imagenet" and volume is None:
        raise SpecError("spec.dataset.volume", "is required when spec.dataset.source is imagenet")
    default_dir = volume.mount_path if volume else "/data"
    data_dir = r.checked("dataDir", rules.path_problem) or default_dir
    if volume is not None and source == "imagenet" and not _inside(data_dir, volume.mount_path):
        raise SpecError(
            r.at("dataDir"), f"{data_dir!r} is outside spec.dataset.volume's mount path {volume.mount_path!r}"
        )
    stage = parse_stage_from(r.data.get("stageFrom"), emulator_hosts=config.emulator_hosts)
    staging = None
    if stage is not None:
        if volume is None:
            raise SpecError(
                "spec.dataset.volume", "is required with spec.dataset.stageFrom (the stager writes to it)"
            )
        destination = resolve_destination(stage, volume.mount_path, data_dir)
        if source != "imagenet":
            raise SpecError(
                r.at("stageFrom"),
                "applies only to spec.dataset.source imagenet (synthetic data reads nothing)",
            )
        annotations = r.child("stageFrom").labels("podAnnotations", values_are_labels=False)
        staging = Staging(stage, destination, annotations)
    return Dataset(source=source, volume=volume, data_dir=data_dir, staging=staging)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")
