"""``python -m dataflow`` is the ``dataflow`` command."""

from ._cli import main

main()
