"""Checks a pstrain embedding export with PyTorch itself.

  check_embedding_export.py EXPORT EXPECTED

EXPORT is what embedding_export wrote; EXPECTED a text file of lines
`row TABLE ID V0 V1 ...` (every row of every table) and
`bag TABLE SUM0 SUM1 ... : ID ID ...` (an EmbeddingBag sum to reproduce).
torch.load reads the export; every row must be there with its values, and
nn.EmbeddingBag.from_pretrained over the weights, with ids mapped to rows
by torch.searchsorted, must give each bag's sum. Exit 0 when all hold.
"""
import sys

import torch


def main(export_path, expected_path):
    exported = torch.load(export_path)
    rows, bags = {}, []
    with open(expected_path) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "row":
                rows.setdefault(parts[1], {})[int(parts[2])] = [float(v) for v in parts[3:]]
            elif parts[0] == "bag":
                colon = parts.index(":")
                bags.append((parts[1], [float(v) for v in parts[2:colon]], [int(i) for i in parts[colon + 1:]]))
    for table, want in rows.items():
        ids, weights = exported[table + ".ids"], exported[table + ".weights"]
        assert ids.dtype == torch.int64 and weights.dtype == torch.float32, (ids.dtype, weights.dtype)
        assert ids.tolist() == sorted(want), "%s: ids %d, expected %d" % (table, len(ids), len(want))
        for i, row_id in enumerate(ids.tolist()):
            # Printed with 9 significant digits: the float32 exactly.
            assert torch.equal(weights[i], torch.tensor(want[row_id], dtype=torch.float32)), \
                "%s: row %d differs" % (table, row_id)
    for table, want, bag_ids in bags:
        ids, weights = exported[table + ".ids"], exported[table + ".weights"]
        bag = torch.nn.EmbeddingBag.from_pretrained(weights, mode="sum")
        got = bag(torch.searchsorted(ids, torch.tensor(bag_ids)), torch.tensor([0]))[0]
        assert torch.allclose(got, torch.tensor(want), atol=1e-5), (table, got, want)
    print("export checked: %d tables, %d bags" % (len(rows), len(bags)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
