"""Benchmark: records per second of ``parse_state_records`` (the delta/snapshot record parser).

    python bench/records.py [--records 1000000] [--repeat 3]

Constant 24-byte keys / 40-byte values (the vectorized fast path), and variable key sizes:
8-byte multiples, as UnsafeRows, and arbitrary sizes, as RocksDB keys with a prefix byte.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from statectl.codecs.records import parse_state_records, write_state_records


def _stream(rng: np.random.Generator, klens: np.ndarray, vlens: np.ndarray) -> bytes:
    def arr(lengths: np.ndarray) -> pa.LargeBinaryArray:
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    return write_state_records(arr(klens), arr(vlens))


def rates(n: int = 1_000_000, repeat: int = 3) -> dict[str, float]:
    """Records per second of ``parse_state_records`` on ``n`` records, best of ``repeat``."""
    rng = np.random.default_rng(0)
    cases = {
        "constant 24B key / 40B value": _stream(rng, np.full(n, 24), np.full(n, 40)),
        "variable key 16-40B (x8) / 40B value": _stream(
            rng, 8 * rng.integers(2, 6, n), np.full(n, 40)
        ),
        "variable key 10-39B / 40B value": _stream(rng, rng.integers(10, 40, n), np.full(n, 40)),
    }
    result = {}
    for name, raw in cases.items():
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            parse_state_records(raw)
            best = min(best, time.perf_counter() - t0)
        result[name] = n / best
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name, rate in rates(args.records, args.repeat).items():
        print(f"{name:40s} {rate / 1e6:8.2f} M records/s")


if __name__ == "__main__":
    main()
