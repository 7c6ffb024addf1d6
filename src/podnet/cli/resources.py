"""``podnet get``, ``describe``, ``apply`` and ``delete``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from podnet.cli import output
from podnet.cli.main import CliError, CliState, pass_state
from podnet.cli.servicedescribe import describe_view
from podnet.client import BOOKMARK, StatusError, resolve_kind
from podnet.client.apply import last_applied, three_way_patch, with_last_applied
from podnet.client.sync import ApiClient
from podnet.model.kinds import KINDS, Kind

OUTPUT_FORMATS = ("wide", "json", "yaml", "name")
# Fields the server owns; a manifest saved with `get -o yaml` may carry them.
_SERVER_META = frozenset(
    [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
    ]
)


namespace_option = click.option("-n", "--namespace", help="Namespace (namespaced kinds only).")


def parse_refs(args: Sequence[str]) -> list[tuple[Kind, str | None]]:
    """``KIND[,KIND...] [NAME]...`` or ``KIND/NAME...`` as (kind, name) pairs (name None:
    all); several kinds take the same names, as ``kubectl get svc,ep web``."""
    if "/" in args[0]:
        refs: list[tuple[Kind, str | None]] = []
        for arg in args:
            kind_name, sep, name = arg.partition("/")
            if not sep or not name or not kind_name:
                raise CliError(
                    f"there is no need to specify a resource type as a separate "
                    f"argument when passing arguments in resource/name form: {arg!r}"
                )
            refs.append((resolve_kind(kind_name), name))
        return refs
    kinds = [resolve_kind(name) for name in args[0].split(",")]
    names: list[str | None] = list(args[1:]) or [None]
    return [(kind, name) for kind in kinds for name in names]


def _by_kind(refs: list[tuple[Kind, str | None]]) -> Iterator[tuple[Kind, list[str | None]]]:
    groups: dict[str, tuple[Kind, list[str | None]]] = {}
    for kind, name in refs:
        groups.setdefault(kind.plural, (kind, []))[1].append(name)
    yield from groups.values()


# ---- get --------------------------------------------------------------------------------


@click.command("get")
@click.argument("args", nargs=-1, required=True, metavar="KIND [NAME]...")
@namespace_option
@click.option("-A", "--all-namespaces", is_flag=True, help="List across all namespaces.")
@click.option("-o", "--output", "fmt", type=click.Choice(OUTPUT_FORMATS), help="Output format.")
@click.option("-l", "--selector", help="Label selector, e.g. app=web,tier!=db.")
@click.option("--field-selector", help="Field selector, e.g. metadata.name=node1.")
@click.option("-w", "--watch", is_flag=True, help="After listing, print changes as they happen.")
@pass_state
def get(
    state: CliState,
    args: tuple[str, ...],
    namespace: str | None,
    all_namespaces: bool,
    fmt: str | None,
    selector: str | None,
    field_selector: str | None,
    watch: bool,
) -> None:
    """Show objects of a kind as a table (or json, yaml, names)."""
    groups = list(_by_kind(parse_refs(args)))
    if watch and len(groups) > 1:
        raise CliError("you may only watch one kind at a time")
    for index, (kind, names) in enumerate(groups):
        if index and fmt in (None, "wide"):
            click.echo("")
        ns = None if all_namespaces and not names[0] else state.namespace(namespace)
        printer = output.Printer(kind, fmt, all_namespaces and names[0] is None)
        version = _show(state.client(), printer, names, ns, selector, field_selector)
        if watch:
            name = names[0] if len(names) == 1 else None
            sel = f"metadata.name={name}" if name else field_selector
            _watch(state.client(), printer, ns, version, selector, sel, name)


def _show(
    client: ApiClient,
    printer: output.Printer,
    names: list[str | None],
    ns: str | None,
    selector: str | None,
    field_selector: str | None,
) -> str | None:
    kind = printer.kind
    if names[0] is not None:
        objects = [client.get(kind, ns, n) for n in names if n is not None]
        printer.initial(objects, single=len(objects) == 1)
        return str(objects[-1].get("metadata", {}).get("resourceVersion") or "") or None
    listing = client.list(kind, ns, label_selector=selector, field_selector=field_selector)
    items = listing.get("items") or []
    printer.initial(items, single=False)
    if not items and printer.fmt in (None, "wide"):
        where = f" in {ns} namespace" if ns and kind.namespaced else ""
        click.echo(f"No resources found{where}.", err=True)
    return (listing.get("metadata") or {}).get("resourceVersion")


def _watch(
    client: ApiClient,
    printer: output.Printer,
    ns: str | None,
    version: str | None,
    selector: str | None,
    field_selector: str | None,
    name: str | None,
) -> None:
    for event in client.watch(
        printer.kind, version, ns, label_selector=selector, field_selector=field_selector
    ):
        obj = event.object
        if event.type == BOOKMARK:
            continue
        if name is None or (obj.get("metadata") or {}).get("name") == name:
            printer.event(obj)


# ---- describe ---------------------------------------------------------------------------


@click.command("describe")
@click.argument("args", nargs=-1, required=True, metavar="KIND NAME...")
@namespace_option
@pass_state
def describe(state: CliState, args: tuple[str, ...], namespace: str | None) -> None:
    """Show one object in detail."""
    refs = parse_refs(args)
    if any(name is None for _, name in refs):
        raise CliError("describe needs a NAME, e.g. podnet describe hostsubnet node1")
    views = []
    for kind, name in refs:
        ns = state.namespace(namespace)
        views.append(describe_view(state.client(), kind, state.client().get(kind, ns, str(name))))
    click.echo("\n\n".join(views))


# ---- manifests --------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """One object read from a file, with its kind and target namespace resolved."""

    kind: Kind
    obj: dict[str, Any]
    namespace: str | None
    source: str

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def ref(self) -> str:
        return f"{self.kind.singular}/{self.name}"


def _read_source(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text()
    except FileNotFoundError as exc:
        raise CliError(f"the path {name!r} does not exist") from exc
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror}") from exc


def _expand(filenames: Iterable[str]) -> Iterator[str]:
    for name in filenames:
        path = Path(name)
        if name != "-" and path.is_dir():
            suffixes = (".yaml", ".yml", ".json")
            yield from sorted(str(p) for p in path.iterdir() if p.suffix in suffixes)
        else:
            yield name


def parse_documents(text: str, source: str) -> list[dict[str, Any]]:
    """The objects in YAML or JSON text: every ``---`` document, ``List`` items expanded."""
    try:
        if text.lstrip().startswith(("{", "[")):
            docs = [json.loads(text)]
        else:
            docs = list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as exc:
        raise CliError(f"{source} is not valid YAML or JSON: {_parse_problem(exc)}") from exc
    objects: list[dict[str, Any]] = []
    for doc in docs:
        if doc is None:
            continue
        items = doc if isinstance(doc, list) else [doc]
        for item in items:
            is_list = isinstance(item, dict) and str(item.get("kind", "")).endswith("List")
            for obj in (item.get("items") or []) if is_list else [item]:
                if not isinstance(obj, dict):
                    raise CliError(f"{source}: every document must be an object")
                objects.append(obj)
    return objects


def _parse_problem(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


def load_manifests(
    filenames: Iterable[str], namespace: str | None, default_namespace: Callable[[], str]
) -> list[Manifest]:
    """Read, parse and check every object before any is sent to the server."""
    manifests = []
    for source in _expand(filenames):
        for obj in parse_documents(_read_source(source), source):
            manifests.append(_manifest(obj, source, namespace, default_namespace))
    if not manifests:
        raise CliError("no objects passed to apply")
    return manifests


def _manifest(
    obj: dict[str, Any], source: str, namespace: str | None, default_namespace: Callable[[], str]
) -> Manifest:
    api_version, kind_name = obj.get("apiVersion"), obj.get("kind")
    if not api_version or not kind_name:
        raise CliError(f"error validating {source}: apiVersion and kind must be set")
    kind = KINDS.by_kind(str(api_version), str(kind_name))
    if kind is None:
        raise CliError(f'{source}: no matches for kind "{kind_name}" in version "{api_version}"')
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        raise CliError(f"error validating {source}: {kind.kind} has no metadata.name")
    if not kind.namespaced:
        return Manifest(kind, obj, None, source)
    own = meta.get("namespace")
    if own and namespace and own != namespace:
        raise CliError(
            f'the namespace from the provided object "{own}" does not match the '
            f'namespace "{namespace}"; pass --namespace={own}'
        )
    return Manifest(kind, obj, own or namespace or default_namespace(), source)


# ---- apply ------------------------------------------------------------------------------


def desired_object(manifest: Manifest) -> dict[str, Any]:
    """What apply asks for: the manifest without server-owned fields, in its namespace."""
    obj = {k: v for k, v in manifest.obj.items() if k != "status"}
    if "status" not in manifest.kind.subresources and "status" in manifest.obj:
        obj["status"] = manifest.obj["status"]
    meta = {k: v for k, v in manifest.obj["metadata"].items() if k not in _SERVER_META}
    if manifest.namespace:
        meta["namespace"] = manifest.namespace
    return {**obj, "metadata": meta}


def apply_manifest(client: ApiClient, manifest: Manifest) -> str:
    """Create the object, or patch it to match; returns created/configured/unchanged."""
    desired = with_last_applied(desired_object(manifest))
    try:
        live = client.get(manifest.kind, manifest.namespace, manifest.name)
    except StatusError as exc:
        if exc.code != 404:
            raise
        # A new object is sent whole, status included (as kubectl does): a Node's
        # addresses live in its status.
        created = dict(desired)
        if "status" in manifest.obj:
            created["status"] = manifest.obj["status"]
        client.create(manifest.kind, created, manifest.namespace)
        return "created"
    patch = three_way_patch(last_applied(live), desired, live)
    if not patch:
        return "unchanged"
    client.patch(manifest.kind, manifest.namespace, manifest.name, patch)
    return "configured"


@click.command("apply")
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    help="File, directory or - (stdin) with YAML or JSON objects.",
)
@namespace_option
@pass_state
def apply(state: CliState, filenames: tuple[str, ...], namespace: str | None) -> None:
    """Create or update objects from files so they match the manifests."""
    manifests = load_manifests(filenames, namespace, lambda: state.namespace(None))
    for manifest in manifests:
        click.echo(f"{manifest.ref} {apply_manifest(state.client(), manifest)}")


# ---- delete -----------------------------------------------------------------------------


@click.command("delete")
@click.argument("args", nargs=-1, metavar="KIND NAME...")
@click.option(
    "-f", "--filename", "filenames", multiple=True, help="Delete the objects named in these files."
)
@namespace_option
@click.option("--ignore-not-found", is_flag=True, help="Treat a missing object as deleted.")
@pass_state
@click.pass_context
def delete(
    ctx: click.Context,
    state: CliState,
    args: tuple[str, ...],
    filenames: tuple[str, ...],
    namespace: str | None,
    ignore_not_found: bool,
) -> None:
    """Delete objects by kind and name, or those described in files."""
    targets = _delete_targets(state, args, filenames, namespace)
    failed = False
    for kind, name, ns in targets:
        try:
            state.client().delete(kind, ns, name)
        except StatusError as exc:
            if exc.code == 404 and ignore_not_found:
                continue
            click.echo(f"error: {exc}", err=True)
            failed = True
            continue
        click.echo(f'{kind.singular} "{name}" deleted')
    if failed:
        ctx.exit(1)


def _delete_targets(
    state: CliState, args: tuple[str, ...], filenames: tuple[str, ...], namespace: str | None
) -> list[tuple[Kind, str, str | None]]:
    if args and filenames:
        raise CliError("give either KIND NAME... or -f FILE, not both")
    if filenames:
        found = load_manifests(filenames, namespace, lambda: state.namespace(None))
        return [(m.kind, m.name, m.namespace) for m in found]
    if not args:
        raise CliError("you must name what to delete: KIND NAME... or -f FILE")
    refs = parse_refs(args)
    if any(name is None for _, name in refs):
        raise CliError(f"give the name of the {refs[0][0].singular} to delete")
    ns = state.namespace(namespace)
    return [(kind, str(name), ns if kind.namespaced else None) for kind, name in refs]
