"""The sharded learner on the GPUs of this machine, with vLLM generating: a few training steps,
then each step's time split into generation, learning and weight sync, and each GPU's peak
memory (as `nvidia-smi` sees it: learner processes and the vLLM engine together).

    python benchmarks/gpu_learner.py [--model default] [--processes N] [--steps 4] [--precision bf16]

`--processes` defaults to every GPU. On one GPU the learner and vLLM share it: the engine sleeps
(frees its weights and KV cache) while the learner updates. Needs a CUDA build of torch and the
`vllm` package (`pip install -e '.[vllm]'`); CI never runs it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay.config import load_config
from selfplay.run_dir import RunDir
from selfplay.train import Trainer

PARTS = ("time/generate_s", "time/learn_s", "time/sync_s", "time/league_s")


class GpuMemoryPeaks:
    """The highest memory in use on each GPU, read from `nvidia-smi` every `every` seconds."""

    def __init__(self, every: float = 0.2):
        self.every = every
        self.peaks: dict[int, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self.stopped.wait(self.every):
            for line in subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines():
                index, used = (int(field) for field in line.split(","))
                self.peaks[index] = max(self.peaks.get(index, 0), used)

    def __enter__(self) -> GpuMemoryPeaks:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--processes", type=int, default=torch.cuda.device_count())
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--games", type=int, default=64, help="games per step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("No GPU: this script measures the sharded learner on GPUs.")
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            "configs/quickstart.yaml",
            [
                f"model={args.model}",
                f"run_dir={run_dir}",
                f"steps={args.steps}",
                f"checkpoint_every={args.steps}",
                "max_minutes=null",
                "eval.every=0",
                "backend=vllm",
                f"backend_precision={args.precision}",
                f"learner.precision={args.precision}",
                f"learner.processes={args.processes}",
                f"rollout.games_per_step={args.games}",
            ],
        )
        with GpuMemoryPeaks() as memory:
            Trainer(config, progress=False).run()
        events = EventAccumulator(str(RunDir(run_dir).tensorboard))
        events.Reload()
        times = {part: [event.value for event in events.Scalars(part)][1:] for part in PARTS}  # step 1 compiles
    step = statistics.mean(sum(values) for values in zip(*times.values()))
    print(
        f"model {args.model}, {args.processes} learner processes on {torch.cuda.device_count()} GPUs, {args.precision}"
    )
    print(f"step {step:.2f} s: " + ", ".join(f"{p.split('/')[1]} {statistics.mean(v):.2f} s" for p, v in times.items()))
    print(f"weight sync: {statistics.mean(times['time/sync_s']) / step:.1%} of a step")
    for index, used in sorted(memory.peaks.items()):
        print(f"GPU {index}: peak {used / 1024:.1f} GiB in use")


if __name__ == "__main__":
    main()
