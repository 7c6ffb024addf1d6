"""``python -m podnet``: the same as the ``podnet`` command."""

from podnet.cli.main import main

main()
