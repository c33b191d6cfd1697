"""Tests of course_lib.data: digits, the offline torchvision path, segmentation tiles, shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import data, files
from course_lib.data import (
    CLASS_COLOURS,
    DatasetUnavailableError,
    ShardSampler,
    generate_vaihingen_tiles,
    load_dataset,
    load_vaihingen_tiles,
    mask_to_rgb,
    rgb_to_mask,
    shard_indices,
    write_vaihingen_tiles,
)

# ---- digits ---------------------------------------------------------------------------------


def test_digits_split_shapes_and_range():
    train, test = load_dataset("digits"), load_dataset("digits", train=False)
    assert len(train) + len(test) == 1797
    assert len(test) == data.digits.DIGITS_NUM_TEST
    X, y = train.tensors
    assert X.shape == (1500, 1, 8, 8) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert X.min() >= 0 and X.max() == 1
    assert set(y.tolist()) == set(range(10)) == set(test.tensors[1].tolist())


def test_digits_split_is_fixed_and_disjoint():
    a, b = load_dataset("digits"), load_dataset("digits")
    assert torch.equal(a.tensors[0], b.tensors[0])
    train = {tuple(x.flatten().tolist()) for x in a.tensors[0]}
    test = {tuple(x.flatten().tolist()) for x in load_dataset("digits", train=False).tensors[0]}
    # digits holds a few identical images; a real overlap of the splits would be far larger.
    assert len(train & test) <= 3


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError) as info:
        load_dataset("imagenet")
    for known in ("digits", "mnist", "fashion_mnist", "cifar10", "segmentation", "vaihingen"):
        assert known in str(info.value)


# ---- torchvision sets offline: tried for real, no mock ----------------------------------------


@pytest.fixture(autouse=True)
def no_route_to_dataset_hosts(monkeypatch):
    """Send downloads through a proxy on a closed local port: a real failed connection, even on
    a machine that can reach the dataset hosts (which would otherwise download 170 MB)."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_offline_download_gives_clear_error_and_leaves_nothing(name, tmp_path, monkeypatch):
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset(name, root=tmp_path)
    message = str(info.value)
    spec = data.TORCHVISION_SETS[name]
    # It names every file to fetch, with the full path where it goes, and the way out.
    for f in spec.files:
        assert str(tmp_path / "cache" / spec.folder / spec.files_at / f).replace("/./", "/") in (
            message.replace("/./", "/")
        )
    assert "COURSE_DATASETS_DIR" in message and "digits" in message
    # No half-written cache: the cache folder is empty (no raw/ left, no .partial- folder).
    assert list((tmp_path / "cache").iterdir()) == []


def test_offline_keeps_files_the_user_put_there(tmp_path):
    raw = tmp_path / "cache" / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    wrong = raw / "train-images-idx3-ubyte.gz"
    wrong.write_bytes(b"not really mnist")  # fails the checksum, so torchvision re-downloads
    with pytest.raises(DatasetUnavailableError):
        load_dataset("mnist", root=tmp_path)
    # The user's file stays; nothing else was added.
    assert sorted(p.name for p in raw.iterdir()) == ["train-images-idx3-ubyte.gz"]
    assert wrong.read_bytes() == b"not really mnist"


def test_env_var_moves_the_datasets_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path))
    assert data.datasets_dir() == tmp_path.resolve()
    assert data.cache_dir() == tmp_path.resolve() / "cache"
    assert data.datasets_dir(tmp_path / "x") == (tmp_path / "x").resolve()  # argument wins


def test_default_datasets_dir_is_the_repos():
    import course_lib

    expected = __import__("pathlib").Path(course_lib.__file__).resolve().parent.parent / "datasets"
    assert data.paths.datasets_dir() == expected or data.ENV_VAR in __import__("os").environ


def test_atomic_write_leaves_no_temp_file(tmp_path):
    target = files.atomic_write_bytes(tmp_path / "a" / "f.bin", b"123")
    files.atomic_write_bytes(target, b"4567")
    assert target.read_bytes() == b"4567"
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


def test_a_failed_atomic_write_leaves_no_temp_file_and_the_old_content(tmp_path, monkeypatch):
    target = files.atomic_write_text(tmp_path / "f.txt", "old\n")
    with pytest.raises(TypeError):  # not bytes: fails while writing, after the temp file exists
        files.atomic_write_bytes(target, None)  # type: ignore[arg-type]

    def full_disk(*args):
        raise OSError("No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)  # written and fsynced, not renamed
    with pytest.raises(OSError, match="No space"):
        files.atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


# ---- generated segmentation set ---------------------------------------------------------------


def test_generated_tiles_are_deterministic_and_seed_dependent():
    a_img, a_mask = generate_vaihingen_tiles(6, 32, seed=3)
    b_img, b_mask = generate_vaihingen_tiles(6, 32, seed=3)
    c_img, _ = generate_vaihingen_tiles(6, 32, seed=4)
    assert np.array_equal(a_img, b_img) and np.array_equal(a_mask, b_mask)
    assert not np.array_equal(a_img, c_img)
    assert a_img.shape == (6, 32, 32, 3) and a_img.dtype == np.uint8
    assert a_mask.shape == (6, 32, 32)


def test_generated_masks_use_exactly_the_six_classes():
    _, masks = generate_vaihingen_tiles(32, 64, seed=0)
    assert set(np.unique(masks).tolist()) == {0, 1, 2, 3, 4, 5}
    freq = np.bincount(masks.ravel(), minlength=6) / masks.size
    assert (freq > 0.003).all()  # every class really appears, cars and clutter included


def test_segmentation_train_and_test_differ():
    train = load_dataset("segmentation", num_tiles=4, tile_size=32)
    test = load_dataset("segmentation", train=False, num_tiles=4, tile_size=32)
    assert train.tensors[0].shape == (4, 3, 32, 32) and train.tensors[1].shape == (4, 32, 32)
    assert not torch.equal(train.tensors[0], test.tensors[0])


@pytest.mark.parametrize("kwargs", [{"num_tiles": 0}, {"tile_size": 8}])
def test_generator_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        generate_vaihingen_tiles(**{"num_tiles": 2, "tile_size": 32, **kwargs})


def test_isprs_colour_coding_round_trip():
    mask = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.uint8)
    rgb = mask_to_rgb(mask)
    assert tuple(rgb[0, 0]) == (255, 255, 255)  # impervious surfaces: white
    assert tuple(rgb[0, 1]) == (0, 0, 255)  # building: blue
    assert tuple(rgb[1, 1]) == (255, 255, 0)  # car: yellow
    assert np.array_equal(rgb_to_mask(rgb), mask)
    assert len({tuple(c) for c in CLASS_COLOURS}) == 6


def test_unknown_mask_colour_is_a_clear_error():
    rgb = mask_to_rgb(np.zeros((2, 2), dtype=np.uint8))
    rgb[1, 1] = (10, 20, 30)
    with pytest.raises(ValueError, match=r"\(10, 20, 30\)"):
        rgb_to_mask(rgb)


def test_vaihingen_loader_reads_tiles_written_by_the_generator(tmp_path):
    images, masks = generate_vaihingen_tiles(3, 32, seed=5)
    write_vaihingen_tiles(tmp_path, images, masks)
    assert sorted(p.name for p in (tmp_path / "gts").iterdir())[0] == "tile_0000.tif"
    ds = load_vaihingen_tiles(tmp_path)
    X, y = ds.tensors
    assert torch.equal(y, torch.from_numpy(masks.astype(np.int64)))
    assert torch.equal((X * 255).round().byte().permute(0, 2, 3, 1), torch.from_numpy(images))
    # Cutting into 16x16 tiles: 4 per 32x32 image, the first equal to the top-left corner.
    cut = load_dataset("vaihingen", root=tmp_path, tile_size=16)
    assert len(cut) == 12 and torch.equal(cut.tensors[1][0], y[0, :16, :16])


def test_vaihingen_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="top/"):
        load_vaihingen_tiles(tmp_path)
    images, masks = generate_vaihingen_tiles(2, 16, seed=0)
    write_vaihingen_tiles(tmp_path, images, masks)
    (tmp_path / "gts" / "tile_0001.tif").unlink()
    with pytest.raises(ValueError, match="tile_0001"):
        load_vaihingen_tiles(tmp_path)


# ---- sharding ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(1, 300),
    world_size=st.integers(1, 9),
    seed=st.integers(0, 10**6),
    epoch=st.integers(0, 50),
)
def test_shards_are_disjoint_and_cover_the_set(num_samples, world_size, seed, epoch):
    if world_size > num_samples:
        return
    shards = [
        shard_indices(num_samples, r, world_size, seed=seed, epoch=epoch) for r in range(world_size)
    ]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == num_samples  # disjoint and covering
    assert sorted(flat) == list(range(num_samples))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    again = [
        shard_indices(num_samples, r, world_size, seed=seed, epoch=epoch) for r in range(world_size)
    ]
    assert shards == again  # the same on every call: every rank can compute it alone


def test_shards_reshuffle_per_epoch_and_seed():
    e0 = shard_indices(100, 1, 4, seed=7, epoch=0)
    assert e0 != shard_indices(100, 1, 4, seed=7, epoch=1)
    assert e0 != shard_indices(100, 1, 4, seed=8, epoch=0)
    assert shard_indices(10, 1, 4, shuffle=False) == [1, 5, 9]


def test_even_shards_have_equal_length():
    shards = [shard_indices(10, r, 4, even=True) for r in range(4)]
    assert [len(s) for s in shards] == [2, 2, 2, 2]
    assert len(set(sum(shards, []))) == 8


@pytest.mark.parametrize(
    ("num_samples", "rank", "world_size", "match"),
    [
        (10, 4, 4, "rank"),
        (10, -1, 4, "rank"),
        (3, 0, 4, "larger than the dataset"),
        (5, 0, 0, "world_size"),
    ],
)
def test_bad_shard_requests(num_samples, rank, world_size, match):
    with pytest.raises(ValueError, match=match):
        shard_indices(num_samples, rank, world_size)
    with pytest.raises(ValueError, match=match):
        ShardSampler(num_samples, rank, world_size)


def test_shard_sampler_follows_set_epoch():
    sampler = ShardSampler(50, 2, 3, seed=1)
    first = list(sampler)
    assert first == shard_indices(50, 2, 3, seed=1, epoch=0) and len(sampler) == len(first)
    sampler.set_epoch(5)
    assert list(sampler) == shard_indices(50, 2, 3, seed=1, epoch=5) != first
    assert len(ShardSampler(10, 3, 4, even=True)) == 2
