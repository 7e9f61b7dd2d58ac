#!/usr/bin/python3
"""Writes a TorchScript click model that pstrain trains with embeddings.

    /usr/bin/python3 examples/ctr_model.py data/ctr_model.pt
    # then, in a job spec with embeddings: (see examples/criteo_synth.yaml)
    #   model: torchscript:ctr_model.pt      (a path under the workers' --data_root)

The calling convention (docs/embeddings.md#models): forward takes
  dense:  Tensor [B, 13] float32, the log-transformed integer features;
  sparse: List[Tensor], one [B, dim] float32 per entry of the spec's
          embeddings.fields, that field's pooled embedding rows;
and returns the logits [B] (or [B, 1]) before any sigmoid. The embedding rows
are not part of the module: the shards hold them and pstrain trains them.
The module's own parameters are trained like any model's (the shards'
tables, or an all-reduce in hybrid mode).

This one is a small "deep" model: the dense features and every pooled field
concatenated, then an MLP.
"""
import sys
from typing import List

import torch


class ConcatMlp(torch.nn.Module):
    def __init__(self, fields: int, dim: int, hidden: int = 64):
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(13 + fields * dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, dense: torch.Tensor, sparse: List[torch.Tensor]) -> torch.Tensor:
        return self.mlp(torch.cat([dense] + sparse, dim=1)).squeeze(1)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: ctr_model.py OUT.pt [FIELDS [DIM]]")
    fields = int(sys.argv[2]) if len(sys.argv) > 2 else 26
    dim = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    torch.manual_seed(0)
    torch.jit.script(ConcatMlp(fields, dim)).save(sys.argv[1])
