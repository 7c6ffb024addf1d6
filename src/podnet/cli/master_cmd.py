"""`podnet master`: run the API server and controllers (filled in by the master work)."""

from __future__ import annotations

import click


@click.command("master")
def master() -> None:
    """Run the podnet master (API server + controllers)."""
    raise click.ClickException("podnet master is not wired yet")
