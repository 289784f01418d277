"""A tiny training step in two arms, for ``kernelab run examples/workload/workload.yaml``.

A 2-layer decoder-only transformer (width 64, 4 heads) on every rank of a ``torchrun`` job:
``rollout`` (greedy generation, no grad), ``log_probs`` (the generated tokens' log-probabilities
under the same weights, recomputed as a trainer does), ``actor_train`` (forward, backward, the
gradients all-reduced, an SGD step) and ``step`` (the three). Metric ``tokens_per_s`` (generated
tokens per rank per second); digest ``logprobs`` (the recomputed log-probabilities).

The arms differ in one kernel choice, ``--attention``:

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks the kernel);
* ``math``: attention written out (``softmax(q k^T / sqrt(d)) v``) with
  ``torch.use_deterministic_algorithms(True)``: the "strict" arm.

Backend: NCCL when the rank has a GPU (``CUDA_VISIBLE_DEVICES`` from the runner), gloo on a CPU.
``EXAMPLE_DIE_ONCE=PATH`` (a test's crash drill): the last rank of the first run that finds no
file at PATH creates it and kills itself with SIGKILL in the middle of its step.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kernelab.workload import digest, metric, phase


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int, attention: str):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )
        self.n1, self.n2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.n1(x))
        return x + self.mlp(self.n2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, attention: str):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--attention", choices=("sdpa", "math"), default="sdpa")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args(argv)

    # cuBLAS is deterministic only with a fixed workspace (PyTorch's reproducibility notes); set
    # before the first CUDA call, or use_deterministic_algorithms(True) makes every matmul raise.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cuda = torch.cuda.is_available()
    rank_local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", rank_local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if args.attention == "math":
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(1234)  # the same weights on every rank and in both arms
    model = TinyLM(128, args.width, 4, args.layers, args.attention).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
    die_once = os.environ.get("EXAMPLE_DIE_ONCE")

    for _ in range(args.steps):
        prompt = torch.randint(0, 128, (args.batch, args.prompt), generator=gen).to(device)
        with phase("step"):
            t0 = time.perf_counter()
            with phase("rollout"), torch.no_grad():
                tokens = prompt
                for _ in range(args.new_tokens):
                    nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
                    tokens = torch.cat([tokens, nxt], dim=1)
            rollout_s = time.perf_counter() - t0
            if die_once and rank == world - 1 and not os.path.exists(die_once):
                open(die_once, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            with phase("log_probs"), torch.no_grad():
                logits = model(tokens[:, :-1]).float()
                logprobs = (
                    logits.log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)[:, args.prompt - 1 :]
                )
            with phase("actor_train"):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                for param in model.parameters():
                    if param.grad is not None:
                        dist.all_reduce(param.grad)
                        param.grad /= world
                opt.step()
        metric("tokens_per_s", args.batch * args.new_tokens / rollout_s, unit="tok/s")
    digest("logprobs", logprobs)
    # Every rank past its last collective before any tears the group down: a gloo rank whose peer
    # closed its connections while its own worker threads were still live aborts at exit
    # ("terminate called without an active exception", SIGABRT), after all its records were written.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
