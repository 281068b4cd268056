"""``python -m monai_vce.text_embeddings``: the ``text-embeddings`` command of :mod:`monai_vce.networks.text_embeddings`."""

from __future__ import annotations

import sys

from monai_vce.networks.text_embeddings import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
