"""Lecture 2: Segmentation tiles in the format of ISPRS Vaihingen (source 000): a generator and a loader.

Source 000 trains a U-Net on the ISPRS Vaihingen aerial images cut into 512x512 tiles. The real
tiles need a registration with ISPRS, so the course generates tiles in the same format: a
three-channel false-colour image (Vaihingen's ``top`` images are IR-R-G, so vegetation looks red)
and a label mask in ISPRS's colour coding, 6 classes. ``load_vaihingen_tiles`` reads a folder of
real tiles (or generated ones written by ``write_vaihingen_tiles``) in the same layout:
``top/<name>.tif`` images beside ``gts/<name>.tif`` masks.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from course_lib.files import atomic_write_bytes

__all__ = [
    "CLASS_NAMES",
    "CLASS_COLOURS",
    "IGNORE_INDEX",
    "generate_vaihingen_tiles",
    "load_segmentation",
    "mask_to_rgb",
    "rgb_to_mask",
    "write_vaihingen_tiles",
    "load_vaihingen_tiles",
]

#: The 6 ISPRS 2D semantic labelling classes, in ISPRS's order.
CLASS_NAMES = (
    "impervious surfaces", "building", "low vegetation", "tree", "car", "clutter/background",
)  # fmt: skip
#: ISPRS's colour coding of the label masks (RGB), one row per class.
CLASS_COLOURS = np.array(
    [[255, 255, 255], [0, 0, 255], [0, 255, 255], [0, 255, 0], [255, 255, 0], [255, 0, 0]],
    dtype=np.uint8,
)
#: Label of pixels to ignore: the black borders of ISPRS's "eroded" ground truth.
IGNORE_INDEX = 255

# Mean IR-R-G colour of each class in the generated tiles (vegetation is bright in IR).
_FALSE_COLOURS = np.array(
    [[120, 115, 120], [150, 90, 95], [190, 110, 120], [160, 70, 80], [70, 70, 160], [95, 80, 60]],
    dtype=np.float32,
)


def _paint_rect(mask: np.ndarray, rng: np.random.Generator, cls: int, lo: int, hi: int) -> None:
    """Paint one axis-aligned rectangle of class ``cls`` with sides in [lo, hi) pixels."""
    size = mask.shape[0]
    h, w = rng.integers(lo, hi, size=2)
    top, left = rng.integers(0, max(1, size - h)), rng.integers(0, max(1, size - w))
    mask[top : top + h, left : left + w] = cls


def _generate_one(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return one (image uint8 (size, size, 3), mask uint8 (size, size)) pair."""
    s = size / 64  # shapes are drawn for a 64-pixel tile and scaled
    mask = np.full((size, size), 2, dtype=np.uint8)  # low vegetation everywhere
    # Roads (impervious surfaces) across the tile: one, sometimes a crossing second one.
    for _ in range(1 + (rng.random() < 0.5)):
        width = max(2, int(rng.integers(8, 16) * s))
        pos = int(rng.integers(0, size - width))
        road = (slice(pos, pos + width), slice(None))
        mask[road if rng.random() < 0.5 else road[::-1]] = 0
    for _ in range(rng.integers(2, 5)):
        _paint_rect(mask, rng, 1, max(3, int(12 * s)), max(4, int(28 * s)))  # buildings
    yy, xx = np.mgrid[:size, :size]
    for _ in range(rng.integers(3, 7)):  # round tree crowns
        cy, cx = rng.integers(0, size, size=2)
        r = rng.uniform(3, 9) * s
        mask[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = 3
    for _ in range(rng.integers(1, 4)):
        _paint_rect(mask, rng, 5, max(2, int(3 * s)), max(3, int(8 * s)))  # clutter
    # Cars: small rectangles on the road.
    road_pixels = np.argwhere(mask == 0)
    for _ in range(rng.integers(2, 6) if len(road_pixels) else 0):
        cy, cx = road_pixels[rng.integers(len(road_pixels))]
        h, w = max(2, int(3 * s)), max(3, int(5 * s))
        mask[cy : cy + h, cx : cx + w] = 4
    image = _FALSE_COLOURS[mask] + rng.normal(0.0, 18.0, size=(size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8), mask


def generate_vaihingen_tiles(
    num_tiles: int = 64, tile_size: int = 64, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Generate Vaihingen-format tiles, the same for the same seed.

    Returns:
        images uint8 (num_tiles, tile_size, tile_size, 3) and masks uint8
        (num_tiles, tile_size, tile_size) with class indices 0..5 (see ``CLASS_NAMES``).
    """
    if num_tiles < 1:
        raise ValueError(f"num_tiles must be at least 1, got {num_tiles}")
    if tile_size < 16:
        raise ValueError(f"tile_size must be at least 16 pixels, got {tile_size}")
    rng = np.random.default_rng(seed)
    pairs = [_generate_one(rng, tile_size) for _ in range(num_tiles)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def _to_dataset(images: np.ndarray, masks: np.ndarray) -> TensorDataset:
    """Return X float32 (N, 3, H, W) in [0, 1] and y int64 (N, H, W)."""
    X = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    return TensorDataset(X, torch.from_numpy(masks.astype(np.int64)))


def load_segmentation(
    *, train: bool = True, num_tiles: int = 64, tile_size: int = 64, seed: int = 0
) -> TensorDataset:
    """Return the generated segmentation set; the test split uses a different seed."""
    # Train and test come from disjoint random streams of the same generator.
    images, masks = generate_vaihingen_tiles(num_tiles, tile_size, seed=seed * 2 + (not train))
    return _to_dataset(images, masks)


def mask_to_rgb(mask: np.ndarray) -> np.ndarray:
    """Colour a class-index mask with ISPRS's coding; ignored pixels become black."""
    rgb = np.zeros((*mask.shape, 3), dtype=np.uint8)
    known = mask != IGNORE_INDEX
    rgb[known] = CLASS_COLOURS[mask[known]]
    return rgb


def rgb_to_mask(rgb: np.ndarray, *, where: str = "mask") -> np.ndarray:
    """Decode an ISPRS colour mask to class indices; black is ``IGNORE_INDEX``.

    Raises:
        ValueError: if a colour is neither an ISPRS class colour nor black.
    """
    codes = rgb[..., :3].astype(np.int64) @ np.array([65536, 256, 1])
    table = {int(c @ np.array([65536, 256, 1])): i for i, c in enumerate(CLASS_COLOURS)}
    table[0] = IGNORE_INDEX
    mask = np.full(codes.shape, -1, dtype=np.int64)
    for code, cls in table.items():
        mask[codes == code] = cls
    if (mask < 0).any():
        bad = int(codes[mask < 0][0])
        colour = (bad >> 16, (bad >> 8) & 255, bad & 255)
        raise ValueError(
            f"{where}: colour {colour} is not an ISPRS class colour; expected one of "
            f"{[tuple(int(v) for v in c) for c in CLASS_COLOURS]} (or black for ignored pixels)"
        )
    return mask.astype(np.uint8)


def _encode_tiff(array: np.ndarray) -> bytes:
    """Return ``array`` (H, W, 3) uint8 as TIFF bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="TIFF")
    return buffer.getvalue()


def write_vaihingen_tiles(
    folder: str | os.PathLike, images: np.ndarray, masks: np.ndarray, *, prefix: str = "tile"
) -> list[Path]:
    """Write tiles as ``top/<prefix>_NNNN.tif`` and colour masks as ``gts/<prefix>_NNNN.tif``."""
    folder = Path(folder)
    written = []
    for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
        name = f"{prefix}_{i:04d}.tif"
        written.append(atomic_write_bytes(folder / "top" / name, _encode_tiff(image)))
        atomic_write_bytes(folder / "gts" / name, _encode_tiff(mask_to_rgb(mask)))
    return written


def load_vaihingen_tiles(
    folder: str | os.PathLike, *, tile_size: int | None = None
) -> TensorDataset:
    """Load Vaihingen-format tiles from ``folder/top`` and ``folder/gts``, matched by file name.

    With ``tile_size``, every image is cut into non-overlapping ``tile_size`` squares (source 000
    cut the Vaihingen areas into 512x512 tiles); leftover borders are dropped.
    """
    from PIL import Image

    folder = Path(folder)
    top, gts = folder / "top", folder / "gts"
    if not top.is_dir() or not gts.is_dir():
        raise ValueError(
            f"{folder} must contain top/ (images) and gts/ (ISPRS colour masks) with matching "
            f"file names; write generated ones with write_vaihingen_tiles(folder, ...)"
        )
    names = sorted(p.name for p in top.iterdir() if p.suffix.lower() in {".tif", ".tiff", ".png"})
    if not names:
        raise ValueError(f"no .tif/.tiff/.png images in {top}")
    missing = [n for n in names if not (gts / n).exists()]
    if missing:
        raise ValueError(f"no mask in {gts} for {missing[:3]} (masks need the same file name)")
    images, masks = [], []
    for name in names:
        image = np.asarray(Image.open(top / name).convert("RGB"))
        mask = rgb_to_mask(np.asarray(Image.open(gts / name).convert("RGB")), where=str(gts / name))
        if image.shape[:2] != mask.shape:
            raise ValueError(f"{name}: image {image.shape[:2]} and mask {mask.shape} differ")
        size = tile_size or None
        if size is None:
            images.append(image)
            masks.append(mask)
            continue
        for r in range(0, image.shape[0] - size + 1, size):
            for c in range(0, image.shape[1] - size + 1, size):
                images.append(image[r : r + size, c : c + size])
                masks.append(mask[r : r + size, c : c + size])
    if not masks:
        raise ValueError(f"tile_size={tile_size} is larger than every image in {top}")
    if len({m.shape for m in masks}) != 1:
        raise ValueError("tiles differ in size; pass tile_size=... to cut them into equal squares")
    return _to_dataset(np.stack(images), np.stack(masks))
