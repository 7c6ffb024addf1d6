"""The ``podnet`` command: global options, shared state, sub-commands, one-line errors.

Every failure a user can cause or meet (bad kubeconfig, unreachable master, rejected
token, an API error, a bad file or argument) ends as a single ``error: ...`` line on
stderr and exit code 1. Only ``--verbose`` shows a traceback, and only for bugs.

``CliState`` is the one object a command receives: it loads the kubeconfig and builds the
``ApiClient`` lazily through ``make_client``, which tests replace with a client on an
``httpx.MockTransport`` (``CliRunner().invoke(cli, args, obj=CliState(make_client=...))``).
Sub-commands are imported when used, so ``podnet get`` never loads the server stack.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import click

from podnet import __version__
from podnet.client import ClientError, StatusError
from podnet.client.sync import ApiClient
from podnet.kubeconfig import ClientConfig, KubeconfigError, load_client_config

# Sub-command name -> (module, attribute), imported on first use.
COMMANDS = {
    "adm": ("podnet.cli.adm_cmd", "adm"),
    "apply": ("podnet.cli.resources", "apply"),
    "cluster": ("podnet.cli.cluster_cmd", "cluster"),
    "controllers": ("podnet.cli.controllers_cmd", "controllers"),
    "controllers-credentials": ("podnet.cli.master_cmd", "controllers_credentials"),
    "delete": ("podnet.cli.resources", "delete"),
    "describe": ("podnet.cli.resources", "describe"),
    "get": ("podnet.cli.resources", "get"),
    "node-credentials": ("podnet.cli.master_cmd", "node_credentials"),
    "node": ("podnet.cli.node_cmd", "node"),
    "pod": ("podnet.cli.pod_cmd", "pod"),
    "router": ("podnet.cli.router_cmd", "router"),
    "router-credentials": ("podnet.cli.router_credentials", "router_credentials"),
    "trace": ("podnet.cli.trace_cmd", "trace"),
}


class CliError(click.ClickException):
    """A failure shown as a single ``error: ...`` line, with exit code 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class ClientFactory(Protocol):
    """Builds the API client for a config; ``ApiClient`` itself is one."""

    def __call__(
        self, config: ClientConfig, *, log: Callable[[str], None] | None = None
    ) -> ApiClient: ...


@dataclass
class CliState:
    """Global options and the lazily built API client."""

    kubeconfig: str | None = None
    verbose: bool = False
    make_client: ClientFactory = ApiClient
    load_config: Callable[[str | None], ClientConfig] = load_client_config
    _config: ClientConfig | None = field(default=None, repr=False)
    _client: ApiClient | None = field(default=None, repr=False)

    def config(self) -> ClientConfig:
        """The current kubeconfig context (loaded once)."""
        if self._config is None:
            self._config = self.load_config(self.kubeconfig)
        return self._config

    def client(self) -> ApiClient:
        """The API client (built once)."""
        if self._client is None:
            log = (lambda line: click.echo(line, err=True)) if self.verbose else None
            self._client = self.make_client(self.config(), log=log)
        return self._client

    def namespace(self, flag: str | None) -> str:
        """-n, else the context's namespace, else ``default``."""
        return flag or self.config().namespace or "default"

    def close(self) -> None:
        """Release the client's connections."""
        if self._client is not None:
            self._client.close()
            self._client = None


pass_state = click.make_pass_decorator(CliState, ensure=True)


def error_message(exc: BaseException) -> str:
    """The text after ``error:`` for a failure, on one line."""
    if isinstance(exc, click.UsageError):
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        text = exc.format_message() + hint
    elif isinstance(exc, click.ClickException):
        text = exc.format_message()
    elif isinstance(exc, StatusError) and exc.code == 401:
        detail = "" if exc.message == exc.reason else f": {exc.message}"
        text = f"you must be logged in to the server (Unauthorized){detail}; check the token"
    elif isinstance(exc, ClientError | KubeconfigError | ValueError):
        text = str(exc)
    elif isinstance(exc, OSError):
        text = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    else:
        text = f"unexpected failure: {type(exc).__name__}: {exc}"
    return " ".join(text.split())


def _master_command() -> click.Command:
    """``podnet master``, imported on use: it pulls in the server stack the client never needs."""
    try:
        from podnet.cli.master_cmd import master
    except ImportError as exc:
        reason = f"podnet master is unavailable: {exc}"

        @click.command("master", help=reason, context_settings={"ignore_unknown_options": True})
        @click.argument("args", nargs=-1, type=click.UNPROCESSED)
        def unavailable(args: tuple[str, ...]) -> None:
            raise click.ClickException(reason)

        return unavailable
    return master


_GLOBAL_FLAGS = ("-v", "--verbose")


def hoist_global_options(args: Sequence[str]) -> list[str]:
    """Move ``--kubeconfig``/``-v`` given after the sub-command to the front, as kubectl
    accepts global flags anywhere (``podnet get hs --kubeconfig x``)."""
    front: list[str] = []
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        if arg == "--":
            rest.extend([arg, *items])
        elif arg in _GLOBAL_FLAGS or arg.startswith("--kubeconfig="):
            front.append(arg)
        elif arg == "--kubeconfig":
            front.extend([arg, next(items, "")])
        else:
            rest.append(arg)
    return front + rest


class PodnetGroup(click.Group):
    """A click group whose ``main`` turns every failure into one ``error:`` line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] != "master":
            args = hoist_global_options(args)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS, "master"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "master":
            return _master_command()
        if cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attribute)
            return command
        return super().get_command(ctx, cmd_name)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if extra.get("obj") is None:
            extra["obj"] = CliState()
        state: CliState = extra["obj"]
        code = self._run(state, args, prog_name, complete_var, extra)
        if not standalone_mode:
            return code
        sys.exit(code)

    def _run(
        self,
        state: CliState,
        args: Sequence[str] | None,
        prog_name: str | None,
        complete_var: str | None,
        extra: dict[str, Any],
    ) -> int:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            return result if isinstance(result, int) else 0
        except (click.Abort, KeyboardInterrupt):
            click.echo("", err=True)
            return 130
        except BrokenPipeError:
            # The reader went away (`podnet get ... | head`): stop quietly.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except Exception as exc:
            if state.verbose and not isinstance(exc, ClientError | click.ClickException):
                traceback.print_exc()
            click.echo(f"error: {error_message(exc)}", err=True)
            return 1
        finally:
            state.close()


@click.group(cls=PodnetGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--kubeconfig",
    metavar="PATH",
    help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log each API request to stderr.")
@click.version_option(__version__, prog_name="podnet")
@click.pass_context
def cli(ctx: click.Context, kubeconfig: str | None, verbose: bool) -> None:
    """podnet: a software-defined network for container clusters."""
    state = ctx.ensure_object(CliState)
    state.kubeconfig = kubeconfig or state.kubeconfig
    state.verbose = verbose or state.verbose


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="podnet")
