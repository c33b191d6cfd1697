"""Benchmark gradient compression: speed and ratio of every compressor and codec on real gradients.

Takes one backward pass of two course models on real data from ``course_lib.data``: the LeNet
CNN on the digits (19 754 parameters) and the U-Net at source 000's size
(``UNet(base_width=16, depth=4)``, 1.94 M parameters, 7.8 MB of float32 gradients) on the
generated Vaihingen-format tiles. For every compressor x codec it prints the median over repeats
of encode (compress + frame + code) and decode (check + decode + decompress) throughput in MB/s
of float32 gradient per CPU second of this process (the machine may be shared: CPU time is what
one core spends, wall time would count other programs too; the goal line shows both), the ratio float32 bytes / bytes on the wire (header included), and the
relative error ||g_hat - g|| / ||g||. Everything runs on one core (torch and codecs single-
threaded). The last line is the goal of lecture 7: int8 + the fastest lossless stage encodes the
8 MB gradient at >= 300 MB/s (aim: 1 GB/s).

    .venv/bin/python bench/bench_compression.py            # about a minute
    .venv/bin/python bench/bench_compression.py --quick    # U-Net only, fewer repeats
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from course_lib.compression import make_codec, make_compressor, pack_many, unpack_many  # noqa: E402
from course_lib.data import load_dataset  # noqa: E402
from course_lib.parallel.exchanges.base import flatten_grads, trainable_parameters  # noqa: E402
from course_lib.training.models import LeNet, UNet  # noqa: E402

COMPRESSORS = [
    ("none", {}), ("float16", {}), ("int8", {}), ("qsgd", {"levels": 7}), ("sign", {}),
    ("topk", {"ratio": 0.01}), ("randomk", {"ratio": 0.01}), ("threshold", None),
]  # fmt: skip
CODECS = [("none", {}), ("zlib", {"level": 1}), ("zstd", {"level": 1}),
          ("mgzip", {"level": 1, "block_size": 1 << 20})]  # fmt: skip
SOURCE_MGZIP = ("mgzip", {"level": 9, "block_size": 100_000_000})  # the source's defaults


def real_gradient(name: str) -> np.ndarray:
    """Return the flat float32 gradient of one backward pass of model ``name`` on real data."""
    torch.manual_seed(0)
    if name == "cnn":
        net, data = LeNet(), load_dataset("digits")
        X, y = data.tensors[0][:64], data.tensors[1][:64]
    else:
        net, data = UNet(base_width=16, depth=4), load_dataset("segmentation", num_tiles=8)
        X, y = data.tensors[0][:4], data.tensors[1][:4]
    loss = torch.nn.functional.cross_entropy(net(X), y, ignore_index=255)
    loss.backward()
    return flatten_grads(trainable_parameters(net)).numpy()


def measure(
    g: np.ndarray, compressor: str, settings: dict, codec: str, codec_settings: dict, repeats: int
) -> dict:
    """Return median encode and decode seconds, the wire size and the relative error."""
    comp = make_compressor(compressor, **settings)
    coder = make_codec(codec, **codec_settings)
    encode, decode, wall = [], [], []
    for _ in range(repeats):
        start, wall_start = time.process_time(), time.perf_counter()
        frame = pack_many([comp.compress(g, "g")[0]], coder)
        middle = time.process_time()
        wall.append(time.perf_counter() - wall_start)
        g_hat = comp.decompress(unpack_many(frame, 1)[0])
        decode.append(time.process_time() - middle)
        encode.append(middle - start)
    error = float(np.linalg.norm(g_hat - g) / max(np.linalg.norm(g), 1e-30))
    return {
        "encode": statistics.median(encode),
        "decode": statistics.median(decode),
        "encode_wall": statistics.median(wall),
        "wire": len(frame),
        "error": error,
    }


def table(name: str, g: np.ndarray, repeats: int) -> dict:
    """Print one model's table; return the rows by (compressor, codec)."""
    mb = g.nbytes / 1e6
    threshold = float(np.quantile(np.abs(g), 0.99))  # sends about 1 % of the values
    print(f"\n{name}: {g.size} values, {mb:.2f} MB float32; median of {repeats}, one core")
    print(f"threshold t = {threshold:.3g} (the 99th percentile of |g|: about 1 % sent)")
    head = f"{'compressor':>10} {'codec':>6} {'enc MB/s':>9} {'dec MB/s':>9} {'ratio':>8} {'rel err':>8}"
    print(head + "\n" + "-" * len(head))
    rows = {}
    for comp, settings in COMPRESSORS:
        settings = {"threshold": threshold} if settings is None else settings
        for codec, codec_settings in CODECS:
            r = measure(g, comp, settings, codec, codec_settings, repeats)
            rows[(comp, codec)] = r
            print(
                f"{comp:>10} {codec:>6} {mb / r['encode']:>9.0f} {mb / r['decode']:>9.0f} "
                f"{g.nbytes / r['wire']:>8.1f} {r['error']:>8.2e}"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="U-Net only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else args.repeats
    models = ["unet"] if args.quick else ["cnn", "unet"]
    rows = {}
    for name in models:
        g = real_gradient(name)
        label = "LeNet on digits" if name == "cnn" else "U-Net(16, 4) on segmentation tiles"
        rows[name] = table(label, g, repeats)
    unet = rows["unet"]
    g = real_gradient("unet")
    r = measure(g, "int8", {}, *SOURCE_MGZIP, repeats=1)
    print(
        f"\nint8 + mgzip at source 000's defaults (level 9, 100 MB blocks): "
        f"{g.nbytes / 1e6 / r['encode']:.1f} MB/s encode, ratio {g.nbytes / r['wire']:.1f}"
    )
    lossless = [c for c, _ in CODECS if c != "none"]
    fastest = min(lossless, key=lambda c: unet[("int8", c)]["encode"])
    r = unet[("int8", fastest)]
    speed, wall = g.nbytes / 1e6 / r["encode"], g.nbytes / 1e6 / r["encode_wall"]
    verdict = "MET" if speed >= 300 else "NOT MET"
    print(
        f"GOAL int8 + {fastest} (fastest lossless) on the {g.nbytes / 1e6:.1f} MB U-Net gradient, "
        f"one core: {speed:.0f} MB/s encode per CPU second ({wall:.0f} MB/s wall clock) "
        f"(goal >= 300, aim 1000): {verdict}; ratio {g.nbytes / r['wire']:.1f}"
    )


if __name__ == "__main__":
    main()
