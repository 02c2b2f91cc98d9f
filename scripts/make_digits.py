"""Writes examples/data/digits.bin for examples/digits.rs: scikit-learn's bundled 8x8 handwritten
digits (1,797 images, from the UCI "Optical Recognition of Handwritten Digits" set by E. Alpaydin
and C. Kaynak, CC BY 4.0), one row of 65 bytes per image: the label (0-9), then the 64 pixels row
by row (each 0-16). Made with scikit-learn 1.9.1 (load_digits).

    python scripts/make_digits.py   # needs scikit-learn
"""
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

digits = load_digits()
pixels = digits.data.astype(np.uint8)
labels = digits.target.astype(np.uint8)
assert pixels.shape == (1797, 64) and pixels.max() <= 16 and labels.max() == 9
rows = np.concatenate([labels[:, None], pixels], axis=1)
out = Path(__file__).resolve().parent.parent / "examples" / "data" / "digits.bin"
out.write_bytes(rows.tobytes())
print(f"wrote {out}: {rows.shape[0]} images, {out.stat().st_size} bytes")
