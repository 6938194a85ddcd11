"""placeholder: filled in by its author"""

from __future__ import annotations
