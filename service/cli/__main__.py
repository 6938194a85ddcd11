"""``python -m service.cli``: what the ``trainyard`` script runs."""

import os

from service.cli import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
main()
