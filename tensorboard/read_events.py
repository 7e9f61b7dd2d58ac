"""An event file reader independent of pstrain's writer: TensorBoard's
record format implemented again in Python, each record's two CRCs checked
with Debian's python3-crc32c, the events parsed with classes protoc
generates from proto/tensorboard.proto.

usage: /usr/bin/python3 read_events.py ROOT FILE...
(ROOT holds proto/tensorboard.proto)

Prints one JSON object: per file, its events (wall_time, step, and the
file_version, scalars or text), the count of complete records, and the bytes
of a partial record at the end (what a crash mid-write leaves). Exit code 0
when every complete record's CRCs hold; 1 (with "error") otherwise.
"""
import importlib
import json
import struct
import subprocess
import sys
import tempfile

import crc32c


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_file(path, pb):
    with open(path, "rb") as f:
        raw = f.read()
    out = {"path": path, "records": 0, "partial_tail_bytes": 0, "events": []}
    off = 0
    while off < len(raw):
        header = raw[off:off + 12]
        if len(header) < 12:
            out["partial_tail_bytes"] = len(raw) - off
            break
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:12])
        if masked(header[:8]) != length_crc:
            raise ValueError(f"{path}: record {out['records']} at byte {off}: bad length CRC")
        end = off + 12 + length + 4
        if end > len(raw):
            out["partial_tail_bytes"] = len(raw) - off
            break
        data = raw[off + 12:off + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[end - 4:end])
        if masked(data) != data_crc:
            raise ValueError(f"{path}: record {out['records']} at byte {off}: bad data CRC")
        event = pb.Event()
        event.ParseFromString(data)
        e = {"wall_time": event.wall_time, "step": event.step}
        if event.HasField("file_version"):
            e["file_version"] = event.file_version
        for v in event.summary.value:
            if v.HasField("simple_value"):
                e.setdefault("scalars", {})[v.tag] = v.simple_value
            elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "text":
                e.setdefault("text", {})[v.tag] = v.tensor.string_val[0].decode("utf-8")
        out["events"].append(e)
        out["records"] += 1
        off = end
    return out


def main():
    root, files = sys.argv[1], sys.argv[2:]
    gen = tempfile.mkdtemp(prefix="pstrain-tb-")
    subprocess.run(["protoc", "-I", root, "--python_out", gen, "proto/tensorboard.proto"], check=True)
    sys.path.insert(0, gen)
    pb = importlib.import_module("proto.tensorboard_pb2")
    try:
        result = {"files": [read_file(p, pb) for p in files]}
    except ValueError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
