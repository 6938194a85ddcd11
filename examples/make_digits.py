"""Write scikit-learn's 8x8 handwritten digits (they ship inside the package: no download)
as digits.npz, the data file every example trains on.

    python examples/make_digits.py digits.npz
"""

import sys

import numpy as np
from sklearn.datasets import load_digits


def main(path: str) -> None:
    digits = load_digits()
    np.savez(path, images=digits.images.astype(np.float32) / 16.0, target=digits.target)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "digits.npz")
