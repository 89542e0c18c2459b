"""The GPU bench's workload: holds N GiB of GPU memory in a known pattern and keeps computing.

    python3 -m bench.gpu.workload --gib N --dir WORK [--device cuda|fake]

cuda: PyTorch. The memory is int32 tensors of up to 1 GiB, chunk i filled by torch.randint
from a CUDA generator seeded with i, so any chunk can be generated again and compared; the
computing is a chain of small matmuls, counted in `steps`. While the driver holds the process
locked or checkpointed its CUDA calls block, so `steps` stops; it goes on after an unlock.
fake: no GPU (for tests on CPU machines, with torpor's fake driver): the chunks are host
memory, and a step counts only while the fake driver's state slot in this process's live
environment says RUNNING.

Files in WORK: status.json (rewritten twice a second: pid, phase, steps, bytes), and on request
(verify.request appears) verify.json: every chunk compared with its pattern; (ping.request
appears) ping.json, written right after the next step that computed: the wall-clock time of the
workload's first answer, which the bench takes after a restore.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

CHUNK = 1 << 30


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


class TorchMemory:
    def __init__(self, nbytes: int) -> None:
        import torch  # type: ignore[import-not-found]  # on the GPU host only

        self.torch = torch
        self.sizes = [min(CHUNK, nbytes - off) // 4 for off in range(0, nbytes, CHUNK)]
        self.chunks = [self.pattern(i, n) for i, n in enumerate(self.sizes)]
        self.a = torch.randn(1024, 1024, device="cuda")
        torch.cuda.synchronize()

    def pattern(self, index: int, count: int) -> Any:
        torch = self.torch
        generator = torch.Generator(device="cuda")
        generator.manual_seed(index)
        return torch.randint(-(2**31), 2**31 - 1, (count,), generator=generator,
                             dtype=torch.int32, device="cuda")

    def step(self) -> bool:
        self.a = self.torch.tanh(self.a @ self.a * 1e-3)
        self.torch.cuda.synchronize()
        return True

    def bad_chunks(self) -> list[int]:
        bad = []
        for i, (chunk, count) in enumerate(zip(self.chunks, self.sizes, strict=True)):
            expected = self.pattern(i, count)
            if not self.torch.equal(chunk, expected):
                bad.append(i)
            del expected
        self.torch.cuda.synchronize()
        return bad


class FakeMemory:
    """Host memory standing in for GPU memory, and the fake driver's state for CUDA calls."""

    def __init__(self, nbytes: int) -> None:
        self.sizes = [min(CHUNK, nbytes - off) for off in range(0, nbytes, CHUNK)]
        self.chunks = [self.pattern(i, n) for i, n in enumerate(self.sizes)]

    @staticmethod
    def pattern(index: int, count: int) -> bytearray:
        return bytearray(random.Random(index).randbytes(count))

    def step(self) -> bool:
        with open("/proc/self/environ", "rb") as f:  # the live block, which the driver rewrites
            env = f.read().split(b"\0")
        slot = next((v[16:] for v in env if v.startswith(b"FAKE_CUDA_STATE=")), b"R")
        time.sleep(0.002)
        return slot[:1] == b"R"

    def bad_chunks(self) -> list[int]:
        return [i for i, (chunk, count) in enumerate(zip(self.chunks, self.sizes, strict=True))
                if chunk != self.pattern(i, count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gib", type=float, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--device", choices=("cuda", "fake"), default="cuda")
    args = parser.parse_args()
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    status_path = os.path.join(args.dir, "status.json")
    request = os.path.join(args.dir, "verify.request")
    ping = os.path.join(args.dir, "ping.request")
    write_json(status_path, {"pid": os.getpid(), "phase": "filling", "steps": 0})
    memory = TorchMemory(nbytes) if args.device == "cuda" else FakeMemory(nbytes)
    steps, last = 0, 0.0
    while True:
        if memory.step():
            steps += 1
            if os.path.exists(ping):
                write_json(os.path.join(args.dir, "ping.json"), {"steps": steps,
                                                                   "time": time.time()})
                os.unlink(ping)
        if os.path.exists(request):
            started = time.monotonic()
            bad = memory.bad_chunks()
            write_json(os.path.join(args.dir, "verify.json"), {
                "ok": not bad, "chunks": len(memory.sizes), "bad_chunks": bad, "steps": steps,
                "seconds": time.monotonic() - started})
            os.unlink(request)
        now = time.monotonic()
        if now - last >= 0.5:
            write_json(status_path, {"pid": os.getpid(), "phase": "ready", "steps": steps,
                                     "bytes": nbytes, "time": time.time()})
            last = now


if __name__ == "__main__":
    main()
